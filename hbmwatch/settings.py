"""All configuration in one validated object: a TOML file plus ``HBMWATCH_*`` variables.

Precedence, highest first: values passed in code, environment variables
(``HBMWATCH_STORE__URL``: sections joined by a double underscore), the TOML file
(``--config``, else ``$HBMWATCH_CONFIG``, else ``./hbmwatch.toml`` when it exists), defaults.
Nothing is read at import time: call ``load_settings()``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from hbmwatch.settings_errors import explain, unknown_env_sections
from hbmwatch.validation import ConfigError

DEFAULT_CONFIG_FILE = "hbmwatch.toml"


class _Section(BaseModel):
    """A settings table: a key it does not know is a typo, refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")


def _shard(text: str | None) -> str | None:
    from hbmwatch.sharding import Shard

    return None if text is None else str(Shard.parse(text))  # raises ValueError naming it


class RemoteSettings(_Section):
    """Samples on an existing TSDB: written by remote-write 1.0, read back by its query API.

    Findings, alerts, incidents, silences and detector state stay in ``store.url``."""

    write_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Remote-write endpoint: VictoriaMetrics http://HOST:8428/api/v1/write, "
        "Prometheus (--web.enable-remote-write-receiver) http://HOST:9090/api/v1/write, Mimir "
        ".../api/v1/push, Thanos Receive .../api/v1/receive. Unset: samples go to store.url.",
    )
    query_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Base of the same engine's Prometheus query API (/api/v1/query is appended): "
        "http://HOST:8428, http://HOST:9090, Mimir's .../prometheus.",
    )
    bearer_token: SecretStr | None = Field(None, description="Sent as Authorization: Bearer.")
    headers: dict[str, str] = Field(
        {}, description="Extra request headers, e.g. X-Scope-OrgID for Mimir or Cortex."
    )
    timeout_seconds: float = Field(10.0, gt=0, le=300)
    max_samples_per_request: int = Field(5_000, gt=0, le=1_000_000)
    retry_min_seconds: float = Field(0.5, gt=0, description="First retry after a 5xx or refusal.")
    retry_max_seconds: float = Field(30.0, gt=0, description="Backoff doubles up to this.")

    @property
    def enabled(self) -> bool:
        return self.write_url is not None

    @field_validator("query_url")
    @classmethod
    def _strip(cls, url: str | None) -> str | None:
        return None if url is None else url.rstrip("/")


class StoreSettings(_Section):
    url: str = Field(
        "sqlite:///hbmwatch.db",
        description="SQLAlchemy URL: sqlite:///FILE (default, in the working directory) or "
        "postgresql+psycopg://USER@HOST/DB",
    )
    raw_retention_days: float = Field(7.0, gt=0, description="Raw samples are kept this long.")
    rollup_1m_retention_days: float = Field(90.0, gt=0)
    rollup_1h_retention_days: float = Field(730.0, gt=0)
    max_future_skew_seconds: float = Field(
        300.0, ge=0, description="Samples further ahead of the store's clock are rejected."
    )
    compaction_grace_seconds: float = Field(
        90.0,
        ge=0,
        description="A minute is compacted into chunks this long after it ends; later samples "
        "are still accepted and merged.",
    )
    max_series_total: int = Field(2_000_000, gt=0)
    max_series_per_metric: int = Field(500_000, gt=0)
    max_values_per_workload_label: int = Field(
        5_000,
        gt=0,
        description="Cardinality cap on each workload label (service, model, pod, ...).",
    )
    max_series_per_query: int = Field(20_000, gt=0)
    max_points_per_query: int = Field(2_000_000, gt=0)
    recent_samples: int = Field(
        4_000_000,
        ge=0,
        description="Newest samples of the detectors' metrics kept in memory (about 24 bytes "
        "each) so a detection cycle need not read them back from the database.",
    )
    remote: RemoteSettings = RemoteSettings()
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    sqlite_busy_timeout_seconds: float = Field(
        60.0, ge=0, description="How long a write waits for another writer's lock."
    )

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str) -> str:
        if not url.startswith(("sqlite://", "postgresql")):
            raise ValueError("store.url must be a sqlite:/// or postgresql+psycopg:// URL")
        return url

    @model_validator(mode="after")
    def _remote_reads_back(self) -> StoreSettings:
        if self.remote.write_url and not self.remote.query_url:
            raise ValueError("store.remote.write_url needs store.remote.query_url to read back")
        return self


class ApiSettings(_Section):
    host: str = Field("127.0.0.1", description="Bind address; 127.0.0.1 unless told otherwise.")
    port: int = Field(8427, ge=1, le=65535)
    read_token: SecretStr | None = Field(None, description="Bearer token for reads.")
    write_token: SecretStr | None = Field(
        None, description="Bearer token for writes: ingest, silences, acknowledge, resolve."
    )
    admin_token: SecretStr | None = Field(None, description="Bearer token for everything.")
    open_reads: bool = Field(True, description="Allow reads without a token.")
    max_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Larger request bodies are refused (413)."
    )
    max_unauthenticated_body_bytes: int = Field(
        64 * 1024,
        ge=0,
        description="Writes whose token is missing or wrong get their 401 before any body is "
        "read; reads without a valid token may send at most this much (413).",
    )
    query_timeout_seconds: float = Field(
        10.0, gt=0, le=600, description="Time budget of one query (over it: 400)."
    )
    promql_raw_max_span_seconds: float = Field(
        6 * 3600.0,
        gt=0,
        description="PromQL over /prometheus reads raw samples for spans up to this long; "
        "longer spans at steps of a minute or more read the minute (or hour) tier.",
    )
    max_concurrent_requests: int = Field(
        8, ge=1, le=1024, description="API requests served at once; more wait in a queue."
    )
    max_queued_requests: int = Field(
        64, ge=0, description="Requests waiting for a slot; past this they get a 503 at once."
    )
    queue_timeout_seconds: float = Field(
        2.0, ge=0, le=60, description="Longest a request waits for a slot before its 503."
    )
    request_timeout_seconds: float = Field(
        30.0, gt=0, le=600, description="A request not answered by then gets a 503."
    )
    federate_max_series: int = Field(
        20_000,
        ge=1,
        le=10_000_000,
        description="Most series one /federate (or /metrics with expose_canonical_series) "
        "answers; past it the answer is a 422 naming this setting, never a cut page.",
    )
    expose_canonical_series: bool = Field(
        False,
        description="Also serve the newest sample of every stored device and workload series "
        "on /metrics, under its canonical name (as /federate does).",
    )
    nice: int = Field(
        5,
        ge=0,
        le=19,
        description="Under hbmwatch up the API runs in its own process at this niceness: when "
        "the CPU is short, the collector gets it before readers.",
    )


TargetKind = Literal[
    "dme", "dcgm", "vllm", "sglang", "tgi", "triton", "training", "mapped", "prometheus"
]
FederatedSource = Literal["dcgm", "dme", "inference"]
LocalSource = Literal["nvml", "amdsmi", "amdsmi-library", "nvidia-smi"]


class TargetSettings(BaseModel):
    model_config = {"extra": "forbid"}

    kind: TargetKind
    url: str = Field(pattern=r"^https?://", description="The page to scrape.")
    labels: dict[str, str] = Field(
        {}, description="Static labels: cluster, rack, host; service, gpu for inference targets."
    )
    interval_seconds: float | None = Field(None, gt=0, le=3600)
    timeout_seconds: float | None = Field(None, gt=0, le=600)
    mapping: str | None = Field(None, description="Mapping file (TOML) for kind = mapped.")
    sources: list[FederatedSource] | None = Field(
        None,
        description="For kind = prometheus: whose series to read back (default: all three).",
    )
    host_label: str | None = Field(
        None,
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="For kind = prometheus: the series label naming the host (default: "
        "Hostname or hostname, else the host part of instance).",
    )

    @model_validator(mode="after")
    def _prometheus_only(self) -> TargetSettings:
        if self.kind != "prometheus" and (self.sources is not None or self.host_label):
            raise ValueError("sources and host_label are for kind = prometheus only")
        return self


class KubernetesExporterSettings(_Section):
    """Exporter pods to scrape, found by label selector (collector/kubernetes.py)."""

    kind: Literal["dcgm", "dme"]
    label_selector: str = Field(
        min_length=1, description="The pods' (or EndpointSlices') label selector, as kubectl -l."
    )
    role: Literal["pod", "endpointslice"] = Field(
        "pod", description="List pods (spec.nodeName, podIP) or EndpointSlices (nodeName)."
    )
    namespace: str | None = Field(None, description="One namespace; unset: all namespaces.")
    port: int | str = Field(
        "metrics", description="A named container (or EndpointSlice) port, or a port number."
    )
    path: str = Field("/metrics", pattern=r"^/")
    scheme: Literal["http", "https"] = "http"
    labels: dict[str, str] = Field(
        {}, description="Static labels (cluster, rack); host is always the pod's node name."
    )
    interval_seconds: float | None = Field(None, gt=0, le=3600)
    timeout_seconds: float | None = Field(None, gt=0, le=600)

    @field_validator("port")
    @classmethod
    def _port_number(cls, port: int | str) -> int | str:
        """``"5000"`` is the port 5000 (a name has a letter, as Kubernetes requires)."""
        number = int(port) if isinstance(port, str) and port.isdigit() else port
        if isinstance(number, int) and not 1 <= number <= 65535:
            raise ValueError(f"port {number} is not between 1 and 65535")
        return number


class KubernetesSettings(_Section):
    """Where the API server is; in a pod, its service account's token and CA by default."""

    exporters: list[KubernetesExporterSettings] = Field(
        [], description="Exporter pods to discover; none: no discovery."
    )
    api_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="The API server; unset: https://$KUBERNETES_SERVICE_HOST:"
        "$KUBERNETES_SERVICE_PORT (in a pod).",
    )
    token_file: str = Field(
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        description="Bearer token file, re-read at every refresh (bound tokens rotate).",
    )
    bearer_token: SecretStr | None = Field(None, description="A token instead of token_file.")
    ca_file: str | None = Field(
        None,
        description="CA bundle of the API server; unset: the service account's ca.crt in a "
        "pod, else the system's.",
    )
    insecure_skip_tls_verify: bool = False
    refresh_seconds: float = Field(30.0, gt=0, le=3600, description="How often pods are listed.")
    timeout_seconds: float = Field(10.0, gt=0, le=300)


class CollectorSettings(_Section):
    targets: list[TargetSettings] = []
    target_file: str | None = Field(
        None, description="JSON or TOML list of targets, re-read when it changes."
    )
    local_sources: list[LocalSource] = Field(
        [], description="In-process sources for this host's own GPUs (NVML, amd-smi, ...)."
    )
    interval_seconds: float = Field(1.0, gt=0, le=3600)
    timeout_seconds: float | None = Field(
        None, gt=0, le=600, description="Default: 0.8 x the interval, at least 5 s, at most 10 s."
    )
    max_page_bytes: int = Field(64 * 2**20, gt=0, description="Larger pages fail the scrape.")
    series_per_target: int = Field(50_000, gt=0, description="Series cap per target.")
    sample_limit: int = Field(
        50_000, gt=0, description="A page with more samples is refused whole (target down)."
    )
    label_value_length_limit: int = Field(
        1024, gt=0, description="Series with a longer label value are dropped and counted."
    )
    latency_window_seconds: float = Field(60.0, gt=0, le=3600)
    spool_dir: str = Field(
        "hbmwatch-spool", description="Where batches wait while the store is down."
    )
    spool_max_bytes: int = Field(512 * 2**20, gt=0)
    flush_seconds: float = Field(
        0.25, gt=0, le=60, description="Longest a sample waits to be written."
    )
    flush_samples: int = Field(20_000, gt=0)
    skip_unchanged_pages: bool = Field(
        True,
        description="A dcgm or dme page identical to the target's last one is not parsed or "
        "stored again; its refresh goes in hbmwatch_target_refresh_seconds (docs/collector.md).",
    )
    inventory_seconds: float = Field(60.0, gt=0)
    workload_label_cap: int = Field(
        10_000,
        gt=0,
        description="Distinct values of each workload label (namespace, pod, container, "
        "job) kept per target in gpu_workload_info; more are counted as dropped (label_cap).",
    )
    slurm_job_mapping_dir: str | None = Field(
        None,
        description="dcgm-exporter's --hpc-job-mapping-dir layout (one file per GPU index "
        "holding its job ids), read each collection into gpu_workload_info{job} for this "
        "host's GPUs.",
    )
    shard: str | None = Field(
        None,
        description="i/N (0-based): scrape only the targets whose URL hashes to shard i of N, "
        "as Prometheus' hashmod; every collector of one fleet is given the same N.",
    )
    kubernetes: KubernetesSettings = KubernetesSettings()
    _shard_form = field_validator("shard")(_shard)

    @property
    def configured(self) -> bool:
        return bool(
            self.targets
            or self.target_file
            or self.local_sources
            or self.kubernetes.exporters
            or self.slurm_job_mapping_dir
        )


class SimulatorSettings(_Section):
    enabled: bool | None = Field(
        None,
        description="Run the simulated fleet; by default only when no real targets are set.",
    )
    scenario: str = Field("default", description="A bundled scenario name or a TOML file.")
    seed: int | None = Field(None, description="Overrides the scenario's seed.")
    speed: float = Field(1.0, gt=0, le=1000, description="Simulated seconds per wall second.")
    base_port: int = Field(
        9500, ge=0, le=65000, description="First node's port (0: any free ports)."
    )
    truth_file: str = Field(
        "hbmwatch-sim-truth.json", description="Where each run writes its ground truth."
    )


class DetectionSettings(_Section):
    enabled: bool = Field(True, description="Run the detectors inside `hbmwatch up`.")
    interval_seconds: float = Field(
        5.0, gt=0, le=600, description="How often a detection cycle reads the new samples."
    )
    step_seconds: float = Field(1.0, gt=0, le=60, description="The detectors' time grid.")
    settle_seconds: float = Field(
        2.0, ge=0, le=300, description="How long a cycle waits for late samples of a step."
    )
    backfill_seconds: float = Field(
        600.0, ge=0, description="How far back the first cycle after a start looks."
    )
    target_first_up_grace_seconds: float = Field(
        60.0,
        ge=0,
        description="A target that has never answered is 'not yet up', not down (no "
        "target_down finding, no page), until this long after its first scrape.",
    )
    throttle_page_after_seconds: float = Field(
        300.0,
        ge=0,
        description="Throttling is recorded as an info finding; it pages (warning) once it "
        "has held a GPU's clock 10%+ under its own baseline this long, or at once when a "
        "workload on that GPU regresses.",
    )
    shard: str | None = Field(
        None,
        description="i/N (0-based): run the per-rack detectors on the GPUs and workloads whose "
        "cluster/rack hash to shard i of N; every detector process of one fleet is given the "
        "same N.",
    )
    fleet_wide: Literal["auto", "also", "only", "off"] = Field(
        "auto",
        description="Where the fleet-wide detectors run (thermal with its cross-rack heat "
        "scope, throttling, latency, outliers per SKU, root cause), over every series: "
        "`auto` beside the racks of shard 0 (or of the whole), `also` beside this process' "
        "racks, `only` here and no racks, `off` not here.",
    )
    _shard_form = field_validator("shard")(_shard)


class ReceiverSettings(_Section):
    """Where alerts go: a Prometheus Alertmanager, or a webhook taking its payload format."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    kind: Literal["alertmanager", "webhook"]
    url: str = Field(
        pattern=r"^https?://",
        description="Alertmanager's base URL (http://host:9093), or the webhook's full URL.",
    )
    bearer_token: SecretStr | None = Field(None, description="Sent as Authorization: Bearer.")
    timeout_seconds: float = Field(5.0, gt=0, le=120)
    max_requests_per_minute: int = Field(
        60, gt=0, description="Rate limit: requests to this receiver in any minute."
    )
    max_alerts_per_request: int = Field(500, gt=0, le=10_000)
    mirror_silences: bool = Field(
        True, description="Alertmanager only: create hbmwatch's silences there too."
    )


class InhibitRuleSettings(_Section):
    """Alertmanager's inhibit rule: a firing source mutes targets sharing the ``equal`` labels."""

    source_matchers: list[str] = Field(min_length=1)
    target_matchers: list[str] = Field(min_length=1)
    equal: list[str] = []

    @field_validator("source_matchers", "target_matchers")
    @classmethod
    def _matchers(cls, value: list[str]) -> list[str]:
        from hbmwatch.matchers import parse_matcher  # the one grammar, the kernel's

        for text in value:
            parse_matcher(text)  # raises ValueError naming the bad matcher
        return value


DEFAULT_INHIBIT_RULES = [
    # A rack's cooling problem: its GPUs' thermal and throttle alerts are the same page.
    InhibitRuleSettings(
        source_matchers=["alertname=HBMRackThermalExcursion"],
        target_matchers=["alertname=~HBMThermalExcursion|GPUThrottling"],
        equal=["cluster", "rack"],
    ),
    # A target down: its host's GPU alerts come from missing data, not the GPUs.
    InhibitRuleSettings(
        source_matchers=["alertname=HbmwatchTargetDown"],
        target_matchers=["scope=~gpu|workload"],
        equal=["cluster", "host"],
    ),
]


class AlertSettings(_Section):
    enabled: bool = Field(True, description="Turn findings into alerts inside `hbmwatch up`.")
    receivers: list[ReceiverSettings] = []
    external_url: str = Field(
        "http://127.0.0.1:8427",
        pattern=r"^https?://",
        description="How people reach this hbmwatch: alert links point under it.",
    )
    pending_seconds: float = Field(
        0.0, ge=0, description="An alert fires once its finding has been open this long."
    )
    keep_firing_seconds: float = Field(
        120.0,
        ge=0,
        description="Flap damping: a resolved finding keeps its alert firing this long; if it "
        "comes back meanwhile the alert never resolved.",
    )
    group_seconds: float = Field(
        900.0,
        gt=0,
        description="An incident resolved this recently reopens for an alert of the same "
        "problem (cause family at a place, docs/alerts.md) instead of a new one starting.",
    )
    resend_seconds: float = Field(
        60.0, gt=0, description="Firing alerts are re-sent this often, as Prometheus does."
    )
    resolved_resend_seconds: float = Field(
        900.0, ge=0, description="Resolved alerts are re-sent this long after resolving."
    )
    retry_seconds: float = Field(1.0, gt=0, description="First retry after a failed delivery.")
    retry_max_seconds: float = Field(300.0, gt=0, description="Backoff doubles up to this.")
    inhibit_rules: list[InhibitRuleSettings] = Field(
        default_factory=lambda: [r.model_copy() for r in DEFAULT_INHIBIT_RULES]
    )

    @field_validator("receivers")
    @classmethod
    def _unique_names(cls, value: list[ReceiverSettings]) -> list[ReceiverSettings]:
        names = [r.name for r in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"receiver names must be unique: {', '.join(dupes)}")
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="HBMWATCH_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    store: StoreSettings = StoreSettings()
    api: ApiSettings = ApiSettings()
    collector: CollectorSettings = CollectorSettings()
    simulator: SimulatorSettings = SimulatorSettings()
    detection: DetectionSettings = DetectionSettings()
    alerts: AlertSettings = AlertSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["console", "json"] = "console"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)


def config_path(explicit: Path | None = None) -> Path | None:
    """The TOML file to read: the one named, else ``$HBMWATCH_CONFIG``, else ./hbmwatch.toml."""
    if explicit is not None:
        return explicit
    env = os.environ.get("HBMWATCH_CONFIG")
    if env:
        return Path(env)
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.exists() else None


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings; any problem is a ConfigError of one line naming the file or variable.

    A named config file must exist; unknown sections and keys are refused, with the closest
    valid spelling, because a typo silently ignored runs with a default nobody chose.
    """
    path = config_path(config)
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist", field="config")
    if problems := unknown_env_sections(Settings):
        raise ConfigError(problems, field="environment")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    try:
        return _FromFile(**overrides)
    except ValidationError as exc:
        raise ConfigError(explain(exc, Settings, path), field="settings") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", field="config") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}", field="config") from None
    except SettingsError as exc:  # e.g. HBMWATCH_ALERTS__RECEIVERS that is not JSON
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"{exc}{cause}".replace("\n", " "), field="environment") from None
