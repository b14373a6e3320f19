"""Workload attribution: exporter pod/job labels and a Slurm directory -> gpu_workload_info,
device series without those labels, a cap per label, and the query over the stored series."""

from __future__ import annotations

from pathlib import Path

import structlog

from hbmwatch.collector.scrape import translator_for
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.slurm import SlurmJobMapping
from hbmwatch.collector.targets import Target
from hbmwatch.collector.translate import Collected
from hbmwatch.records import Sample, Workload
from hbmwatch.settings import CollectorSettings
from hbmwatch.store.store import Store
from tests.conftest import FIXTURES, NOW

AMD_UPSTREAM = FIXTURES / "upstream" / "amd-device-metrics-exporter"
DCGM_POD_PAGE = FIXTURES / "upstream" / "linode-lke-ai-conformance" / "dcgm-exporter-k8s-page.prom"
DME_JOB_LINE = AMD_UPSTREAM / "readme-slurm-job-series.prom"
T0 = int(NOW * 1000) - 600_000
WORKLOAD_LABELS = {"namespace", "pod", "container", "job", "pod_uid", "job_id"}


def _info(out: Collected) -> list[dict[str, str]]:
    return [s.series.label_dict for s in out.samples if s.series.metric == "gpu_workload_info"]


def _device_series(out: Collected) -> list[Sample]:
    return [s for s in out.samples if s.series.metric != "gpu_workload_info"]


def test_dcgm_pod_labels_become_one_info_series_and_leave_device_series() -> None:
    t = DcgmTranslator()
    text = DCGM_POD_PAGE.read_text()
    for ts in (T0, T0 + 1000, T0 + 2000):  # line by line, shape pending, shaped fast path
        out = t.translate_text(text, ts)
        assert _info(out) == [{
            "host": "lke529760-766837-0a634ab30000", "gpu": "0", "namespace": "default",
            "pod": "cuda-75454ffb9f-8ljq7", "container": "cuda",
        }]  # fmt: skip
        devices = _device_series(out)
        assert len(devices) > 5
        assert all(not WORKLOAD_LABELS & set(s.series.label_dict) for s in devices)
        assert all(s.value == 1.0 for s in out.samples if s.series.metric == "gpu_workload_info")


def _dme_page(pod: str) -> str:
    """The README's job-labelled line's label set (old build, upper case) on a family hbmwatch
    maps, and a current build's lower-case pod labels on a second GPU."""
    line = DME_JOB_LINE.read_text().strip()
    line = line.replace("gpu_edge_temperature", "gpu_junction_temperature")
    current = (
        'gpu_junction_temperature{card_model="0x74a1",gpu_id="1",hostname="mi-1",'
        f'gpu_uuid="u-1",serial_number="s1",pod="{pod}",namespace="ml",container="trainer",'
        'job_id="",job_user="",job_partition=""} 41'
    )
    return f"{line}\n{current}\n"


def test_dme_job_and_pod_labels_old_and_current_builds() -> None:
    t = DmeTranslator({"host": "mi-1"})
    for ts in (T0, T0 + 1000, T0 + 2000):
        out = t.translate_text(_dme_page("train-0"), ts)
        got = sorted(_info(out), key=lambda d: d["gpu"])
        assert got == [
            {"host": "mi-1", "gpu": "0", "job": "32"},
            {"host": "mi-1", "gpu": "1", "namespace": "ml", "pod": "train-0",
             "container": "trainer"},
        ]  # fmt: skip
        assert all(not WORKLOAD_LABELS & set(s.series.label_dict) for s in _device_series(out))


def test_a_pod_moving_away_ends_its_info_series() -> None:
    t = DmeTranslator({"host": "mi-1"})
    t.translate_text(_dme_page("train-0"), T0)
    t.translate_text(_dme_page("train-0"), T0 + 1000)
    out = t.translate_text(_dme_page("train-1"), T0 + 2000)
    assert {d.get("pod") for d in _info(out)} == {None, "train-1"}


def test_the_cap_per_label_counts_the_overflow_and_warns_once() -> None:
    settings = CollectorSettings(workload_label_cap=2)
    t = translator_for(Target(url="http://n1:9400/metrics", kind="dcgm"), settings)
    base = DCGM_POD_PAGE.read_text()
    dropped = []
    with structlog.testing.capture_logs() as logs:
        for i in range(4):  # pods p0..p3 in turn: p2 and p3 are past the cap of 2
            page = base.replace("cuda-75454ffb9f-8ljq7", f"p{i}")
            for step in range(3):
                out = t.translate_text(page, T0 + i * 10_000 + step * 1000)
                dropped.append(out.dropped["label_cap"])
                assert [d["pod"] for d in _info(out)] == ([f"p{i}"] if i < 2 else [])
    assert dropped == [0] * 6 + [1] * 6
    assert sum("workload label cap reached" in e["event"] for e in logs) == 1


def test_slurm_job_mapping_directory(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "1").write_text("4243\n4244\n\n")
    (tmp_path / "MIG-abc").write_text("9\n")  # not an index: skipped, as dcgm-exporter does
    (tmp_path / "2").mkdir()
    source = SlurmJobMapping(tmp_path, {"cluster": "c1"}, host="n7")
    got = sorted((d["gpu"], d["job"]) for d in _info(source.collect(T0)))
    assert got == [("0", "4242"), ("1", "4243"), ("1", "4244")]
    assert all(d["host"] == "n7" and d["cluster"] == "c1" for d in _info(source.collect(T0)))
    (tmp_path / "1").unlink()  # the epilog: the job ended
    assert [d["job"] for d in _info(source.collect(T0 + 1000))] == ["4242"]


def test_slurm_missing_directory_is_one_warning_not_a_crash(tmp_path: Path) -> None:
    source = SlurmJobMapping(tmp_path / "absent", host="n7")
    with structlog.testing.capture_logs() as logs:
        assert source.collect(T0).samples == [] and source.collect(T0 + 1).samples == []
    assert sum("slurm job mapping unreadable" in e["event"] for e in logs) == 1


def test_which_workloads_ran_on_these_gpus(store: Store) -> None:
    t = DcgmTranslator()
    base = DCGM_POD_PAGE.read_text()
    early, late = (
        base.replace("cuda-75454ffb9f-8ljq7", "early"),
        base.replace("cuda-75454ffb9f-8ljq7", "late"),
    )
    for i in range(3):
        store.write(t.translate_text(early, T0 + i * 1000).samples)
    for i in range(3):
        store.write(t.translate_text(late, T0 + 300_000 + i * 1000).samples)
    gpu = {"host": "lke529760-766837-0a634ab30000", "gpu": "0"}
    pod = Workload(namespace="default", container="cuda", host=gpu["host"], gpu="0")
    assert store.workloads([gpu], T0, T0 + 5_000) == [Workload(**{**vars_of(pod), "pod": "early"})]
    both = store.workloads([gpu], T0, T0 + 400_000)
    assert [w.pod for w in both] == ["early", "late"]
    assert store.workloads([{"host": "other", "gpu": "0"}], T0, T0 + 400_000) == []
    assert [w.pod for w in store.workloads(None, T0 + 200_000, T0 + 400_000)] == ["late"]


def vars_of(w: Workload) -> dict[str, str]:
    return {f: getattr(w, f) for f in w.__dataclass_fields__}


def test_no_attribution_stored_reads_nothing(store: Store) -> None:
    assert store.workloads([{"host": "n1", "gpu": "0"}], T0, T0 + 1000) == []


def test_read_back_from_prometheus_the_exported_pod_labels_name_the_workload() -> None:
    """Kubernetes SD puts the exporter's own pod on every line; the GPU's pod comes as
    exported_pod.  A GPU with no workload names none (not the exporter's pod)."""
    from hbmwatch.collector.sources.federated import FederatedTranslator

    target = 'job="dcgm",instance="10.0.0.1:9400",namespace="gpu-operator",pod="dcgm-x"'
    page = "\n".join([
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1",{target},exported_namespace="ml",'
        f'exported_pod="train-0",exported_container="trainer"}} 50 {T0}',
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",Hostname="n1",{target}}} 40 {T0}',
    ])  # fmt: skip
    out = FederatedTranslator().translate_text(page + "\n", T0)
    assert _info(out) == [{"host": "n1", "gpu": "0", "namespace": "ml", "pod": "train-0",
                           "container": "trainer"}]  # fmt: skip
    assert all(not WORKLOAD_LABELS & set(s.series.label_dict) for s in _device_series(out))
