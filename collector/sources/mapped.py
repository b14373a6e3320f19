"""Any other Prometheus target, through a mapping file: renames, label maps, factors.

```toml
# mapping.toml: one [[metric]] per family to keep, [[histogram]] for latency/step histograms
[[metric]]
source = "my_gpu_hbm_temp"              # family name on the page
metric = "gpu_memory_temperature_celsius"
scale = 1.0                             # into the canonical unit
labels = { gpu = "index" }              # canonical label <- the page's label
static = { vendor = "nvidia" }          # fixed canonical labels

[[histogram]]
source = "train_step_seconds"
phase = "step"                          # ttft | inter_token | e2e | step
labels = { service = "job" }
```

Target labels (cluster, rack, host, service ...) apply on top; the store checks the result
against the canonical model, so a mapping to an unknown metric or label is refused there,
by name.  Families the file does not name are dropped as ``unmapped``.

Any other series (a queue depth, a request rate, a job's loss) maps to
``user_series_value``, named by its ``series`` label: fixed, or from a page label (one
series per value of it).  The generic detector (``detectors/generic.py``) scores each
such series sample by sample and raises a ``series_anomaly`` when it leaves its learned
level, trend or daily shape:

```toml
[[metric]]
source = "app_queue_depth"
metric = "user_series_value"
static = { series = "queue_depth" }     # one series
[[metric]]
source = "app_errors"
metric = "user_series_value"
labels = { series = "kind" }            # app_errors{kind="timeouts"}: series "timeouts"
```
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hbmwatch import metrics
from hbmwatch.collector.exposition import ParsedPage, ParsedSample, SeriesCache, parse
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.targets import read_config_text
from hbmwatch.collector.translate import Collected, Mapped
from hbmwatch.records import SeriesKey
from hbmwatch.validation import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricRule(_Strict):
    source: str
    metric: str
    scale: float = 1.0
    labels: dict[str, str] = {}
    static: dict[str, str] = {}


class HistogramRule(_Strict):
    source: str
    phase: str = Field(pattern="^(ttft|inter_token|e2e|step)$")
    labels: dict[str, str] = {}


class Mapping_(_Strict):
    metric: list[MetricRule] = []
    histogram: list[HistogramRule] = []


def load_mapping(path: Path) -> Mapping_:
    if not path.exists():
        raise ConfigError(f"mapping file {path} does not exist", field="mapping")
    try:
        data = tomllib.loads(read_config_text(path, "mapping"))
        mapping = Mapping_.model_validate(data)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", field="mapping") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply", field="mapping") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {loc}: {first['msg']}", field="mapping") from None
    for i, rule in enumerate(mapping.metric):
        if rule.metric not in metrics.METRICS:
            raise ConfigError(
                f"{path}: metric[{i}].metric: {rule.metric!r} is not a canonical "
                "metric (docs/metrics.md)",
                field="mapping",
            )
    return mapping


class MappedTranslator:
    kind = "mapped"

    def __init__(
        self,
        mapping: Mapping_,
        static_labels: Mapping[str, str] | None = None,
        *,
        window_seconds: float = 60.0,
        series_cap: int = 200_000,
    ) -> None:
        self.static = dict(static_labels or {})
        self.rules = {r.source: r for r in mapping.metric}
        label_map: dict[str, str] = {}
        for h in mapping.histogram:
            label_map.update(h.labels)
        self._histograms = InferenceTranslator(
            static_labels,
            window_seconds=window_seconds,
            phases={h.source: h.phase for h in mapping.histogram},
            label_map=label_map,
        )
        self._memo: dict[str, Mapped] = {}
        self._series = SeriesCache(series_cap)

    def _map(self, sample: object) -> Mapped:
        assert isinstance(sample, ParsedSample)
        rule = self.rules.get(sample.series.name)
        if rule is None:
            return Mapped(None, drop="unmapped")
        page_labels = sample.series.label_dict()
        allowed = metrics.METRICS[rule.metric].allowed_labels
        labels = {k: v for k, v in self.static.items() if k in allowed}
        labels.update(rule.static)
        for canonical, source in rule.labels.items():
            if source in page_labels:
                labels[canonical] = page_labels[source]
        return Mapped(SeriesKey(rule.metric, labels), rule.scale)

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        return self.translate(parse(text, self._series), ts_ms)

    def clear(self) -> None:
        self._series.clear()
        self._memo.clear()

    def translate(self, page: ParsedPage, ts_ms: int) -> Collected:
        out = self._histograms.translate(page, ts_ms)
        histogram_names = set(self._histograms.phases)
        for sample in page.samples:
            name = sample.series.name
            if name.rsplit("_", 1)[0] in histogram_names or name in histogram_names:
                continue
            m = self._memo.get(sample.key)
            if m is None:
                m = self._memo[sample.key] = self._map(sample)
            if m.key is None:
                out.drop(m.drop or "unmapped")
            else:
                out.add(m.key, ts_ms, sample.value * m.scale)
        return out
