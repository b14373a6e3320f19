"""The Helm chart (deploy/helm/hbmwatch): rendered for each CI values file and checked.

Rendered offline with Helm's own Go SDK (helm_python) and linted; every manifest validated
strictly against the Kubernetes schemas kubernetes_validate ships, the ServiceMonitor and
PrometheusRule against prometheus-operator's CRD schemas (tests/fixtures/upstream/
prometheus-operator); the PrometheusRule's groups are `hbmwatch rules`' and pass promtool;
the settings file the chart writes loads with hbmwatch's own settings; the RBAC covers what
discovery reads.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from hbmwatch.alerts.promrules import RULES_FILE, TESTS_FILE, render_rules, render_rules_tests
from hbmwatch.collector.kubernetes import list_path
from hbmwatch.settings import Settings, load_settings
from tests.conftest import FIXTURES, REPO

CHART = REPO / "deploy" / "helm" / "hbmwatch"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CRDS = FIXTURES / "upstream" / "prometheus-operator"
NAMESPACE = "gpu-monitoring"
#: The newest Kubernetes whose schemas kubernetes_validate ships (strict: unknown fields
#: fail), and the oldest the chart supports (Chart.yaml's kubeVersion).
KUBE_VERSION = kubernetes_validate.latest_version()
OLDEST_KUBE = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
OLDEST_KUBE = OLDEST_KUBE.removeprefix(">=").removesuffix("-0")


def values_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """Every manifest the chart renders with ci/<name>, hooks included."""
    chart = helm.Chart.load(CHART)
    files = chart.render(values_of(CHART / "ci" / name), name="hbmwatch", namespace=NAMESPACE)
    docs = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
    return tuple(docs)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    plural = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}[kind]
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{plural}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def validate_manifest(doc: dict[str, Any], version: str = KUBE_VERSION) -> None:
    """Raise when ``doc`` is not a valid object of its kind."""
    if doc.get("apiVersion", "").startswith("monitoring.coreos.com/"):
        # Not check_schema: the CRD's patterns are Go's (a mid-pattern "(?i)"), which Python's
        # re refuses; a pattern is compiled only when its field is present.
        jsonschema.Draft7Validator(crd_schema(doc["kind"])).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["spec"]["template"]["spec"]["containers"]


def workloads(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_chart_lints_clean(values: Path) -> None:
    report = helm.lint(CHART, values_of(values), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_every_manifest_validates(values: Path) -> None:
    docs = rendered(values.name)
    assert workloads(docs), "no workload rendered"
    assert OLDEST_KUBE == "1.28.0"  # StatefulSets label pods with their index from 1.28
    for doc in docs:
        validate_manifest(doc)
        validate_manifest(doc, OLDEST_KUBE)


def test_a_broken_manifest_fails_validation() -> None:
    """The checks above would catch a template that renders a wrong field or type."""
    (deployment,) = of_kind(rendered("default-values.yaml"), "Deployment")
    unknown = copy.deepcopy(deployment)
    containers(unknown)[0]["readinessProbes"] = containers(unknown)[0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(unknown)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(wrong_type)
    (monitor,) = of_kind(rendered("monitoring-values.yaml"), "ServiceMonitor")
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"] = {"port": "http"}  # a list in the CRD
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(broken)


def test_split_without_a_store_secret_refuses_to_render() -> None:
    with pytest.raises(helm.HelmError, match="mode split needs PostgreSQL"):
        helm.Chart.load(CHART).render({"mode": "split"}, name="hbmwatch", namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"mode": "splt"}, "at '/mode': value must be one of 'single', 'split'"),
        ({"collector": {"shards": 0}}, "at '/collector/shards': minimum: got 0, want 1"),
        ({"discovery": {"exporters": [{"kind": "nvml", "labelSelector": "a=b"}]}},
         "at '/discovery/exporters/0/kind'"),
        ({"discovery": {"exporters": [{"kind": "dcgm"}]}}, "labelSelector"),
        ({"disovery": {"enabled": True}}, "additional properties 'disovery' not allowed"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_by_name(values: dict[str, Any], error: str) -> None:
    """values.schema.json: a typo or a wrong value fails the install, naming the key."""
    with pytest.raises(helm.HelmValuesError) as caught:
        helm.Chart.load(CHART).render(values, name="hbmwatch", namespace=NAMESPACE)
    assert error in str(caught.value)


def test_the_prometheus_rule_is_what_hbmwatch_rules_writes() -> None:
    """The chart's copy is `hbmwatch rules --out deploy/helm/hbmwatch/files` at this code."""
    assert (CHART / "files" / RULES_FILE).read_text() == render_rules(), (
        "stale: run `hbmwatch rules --out deploy/helm/hbmwatch/files`"
    )
    assert (CHART / "files" / TESTS_FILE).read_text() == render_rules_tests()
    (rule,) = of_kind(rendered("monitoring-values.yaml"), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(render_rules())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_promtool_accepts_the_rendered_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail("promtool is not installed (HBMWATCH_REQUIRE_SERVICES=1)")
        pytest.skip("promtool is not installed")
    (rule,) = of_kind(rendered("monitoring-values.yaml"), "PrometheusRule")
    rules = tmp_path / RULES_FILE
    rules.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    tests = tmp_path / TESTS_FILE
    tests.write_text(render_rules_tests())
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def container_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def settings_in(docs: tuple[dict[str, Any], ...], tmp_path: Path, **env: str) -> Settings:
    """The chart's settings file, loaded by hbmwatch with the variables a pod gets."""
    (config,) = of_kind(docs, "ConfigMap")
    path = tmp_path / "hbmwatch.toml"
    path.write_text(config["data"]["hbmwatch.toml"])
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        return load_settings(path)


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_settings_file_loads(values: Path, tmp_path: Path) -> None:
    docs = rendered(values.name)
    settings = settings_in(docs, tmp_path)
    assert settings.api.host == "0.0.0.0" and settings.api.port == 8427
    assert settings.collector.spool_dir == "/var/lib/hbmwatch/spool"
    assert settings.simulator.enabled is False
    discovering = values_of(values).get("discovery", {}).get("enabled", False)
    assert bool(settings.collector.kubernetes.exporters) == discovering


def test_discovery_settings_and_rbac_match(tmp_path: Path) -> None:
    """Each list discovery makes is allowed by the rendered Role or ClusterRole."""
    docs = rendered("discovery-values.yaml")
    exporters = settings_in(docs, tmp_path).collector.kubernetes.exporters
    assert [(e.kind, e.role, e.namespace, e.port, e.labels) for e in exporters] == [
        ("dcgm", "pod", None, "metrics", {"cluster": "prod-a"}),
        ("dme", "endpointslice", "kube-amd-gpu", "metrics", {"cluster": "prod-a"}),
        ("dme", "pod", "kube-amd-gpu", 5000, {"cluster": "prod-a"}),
    ]
    granted = set()
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        where = role["metadata"].get("namespace") if role["kind"] == "Role" else None
        for rule in role["rules"]:
            assert set(rule["verbs"]) == {"get", "list", "watch"}
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.add((where, group, resource))
    needed = set()
    for e in exporters:
        group = "" if e.role == "pod" else "discovery.k8s.io"
        needed.add((e.namespace, group, list_path(e).rsplit("/", 1)[1]))
    assert granted == needed
    bindings = of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")
    (account,) = of_kind(docs, "ServiceAccount")
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": NAMESPACE,
                                        "name": account["metadata"]["name"]}]  # fmt: skip
    (deployment,) = of_kind(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_no_discovery_no_rbac_and_no_token() -> None:
    docs = rendered("default-values.yaml")
    assert not [d for d in docs if d["kind"].endswith(("Role", "RoleBinding"))]
    (deployment,) = of_kind(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_split_roles_and_their_shards(tmp_path: Path) -> None:
    docs = rendered("split-values.yaml")
    by_name = {d["metadata"]["name"]: d for d in workloads(docs)}
    assert sorted(by_name) == ["hbmwatch-collect", "hbmwatch-detect", "hbmwatch-migrate",
                               "hbmwatch-serve"]  # fmt: skip
    for name, command, shards, setting in [
        ("hbmwatch-collect", ["collect"], 3, "HBMWATCH_COLLECTOR__SHARD"),
        ("hbmwatch-detect", ["detect", "--metrics-port", "9108"], 2, "HBMWATCH_DETECTION__SHARD"),
    ]:
        workload = by_name[name]
        (container,) = containers(workload)
        assert workload["kind"] == "StatefulSet" and workload["spec"]["replicas"] == shards
        assert container["args"] == command
        env = container_env(container)
        assert env["POD_INDEX"] == {
            "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
        }
        assert env[setting] == f"$(POD_INDEX)/{shards}"
        for index in range(shards):  # what Kubernetes expands it to, hbmwatch accepts
            shard = env[setting].replace("$(POD_INDEX)", str(index))
            settings = settings_in(docs, tmp_path, **{setting: shard})
            section = settings.collector if "COLLECTOR" in setting else settings.detection
            assert section.shard == f"{index}/{shards}"
    assert containers(by_name["hbmwatch-serve"])[0]["args"] == ["serve"]
    assert by_name["hbmwatch-serve"]["spec"]["replicas"] == 2
    job = by_name["hbmwatch-migrate"]
    assert containers(job)[0]["args"] == ["migrate"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_secrets_come_from_secrets(values: Path) -> None:
    """The store URL and tokens are secretKeyRefs; values.yaml holds no literal secret."""
    spec = values_of(values)
    for workload in workloads(rendered(values.name)):
        for container in containers(workload):
            env = container_env(container)
            url = env["HBMWATCH_STORE__URL"]
            if spec.get("store", {}).get("existingSecret"):
                assert url == {"secretKeyRef": {"name": "hbmwatch-store", "key": "url"}}
            else:
                assert url == "sqlite:////var/lib/hbmwatch/hbmwatch.db"
            tokens = {n: v for n, v in env.items() if n.endswith("_TOKEN")}
            serves = container["args"][0] in ("up", "serve")  # only an API needs the tokens
            assert bool(tokens) == (serves and bool(spec.get("api", {}).get("existingSecret")))
            for value in tokens.values():
                assert value["secretKeyRef"]["name"] == "hbmwatch-api"
    defaults = (CHART / "values.yaml").read_text()
    assert "password" not in defaults.lower().replace("password@", "")
    assert "token:" not in defaults


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_pods_run_unprivileged_with_limits_and_real_probes(values: Path) -> None:
    from hbmwatch.api.routes.health import router

    api_paths = {route.path for route in router.routes}  # type: ignore[attr-defined]
    for workload in workloads(rendered(values.name)):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"] and container["resources"]["limits"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe in container and container["args"][0] in ("up", "serve"):
                    assert container[probe]["httpGet"]["path"] in api_paths


def test_network_policy_lets_in_the_api_and_out_to_what_hbmwatch_reaches() -> None:
    (policy,) = of_kind(rendered("split-values.yaml"), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    sources = [peer for rule in spec["ingress"] for peer in rule["from"]]
    namespaces = {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for p in sources if "namespaceSelector" in p}  # fmt: skip
    assert namespaces == {"grafana", "monitoring"}
    ports = {p["port"] for rule in spec["egress"] for p in rule["ports"]}
    assert {53, 5432, 9400, 5000, 443, 6443, 9093, 8428} <= ports
    (postgres,) = [r for r in spec["egress"] if r["ports"] == [{"port": 5432, "protocol": "TCP"}]]
    assert postgres["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db"}}}
    ]


def test_service_monitor_scrapes_the_api_and_detectors_with_the_read_token() -> None:
    docs = rendered("monitoring-values.yaml")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"http", "metrics"}
    assert endpoints["http"]["authorization"]["credentials"] == {
        "name": "hbmwatch-api",
        "key": "read-token",
    }
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    selector = monitor["spec"]["selector"]["matchLabels"]
    matched = [s for s in services.values()
               if selector.items() <= s["metadata"]["labels"].items()]  # fmt: skip
    named_ports = {p["name"] for s in matched for p in s["spec"].get("ports", [])}
    assert {"http", "metrics"} <= named_ports
