"""``/metrics``: hbmwatch's derived signals and health, as Prometheus collects them.

Every family is named and described once, in ``hbmwatch.metrics`` (``EXPORTED`` and the
collector-scope canonical metrics); this module only fills in values at scrape time: the
newest detection snapshot (thermal margins, scores, p99s), open findings, alerts and
incidents from the store, and the targets' health from the newest stored samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hbmwatch import log
from hbmwatch.metrics import EXPORTED, MetricDef, Scope, by_scope
from hbmwatch.query import Selector
from hbmwatch.records import AlertState, IncidentState
from hbmwatch.status import LabelledValue, ServiceStatus
from hbmwatch.store.store import Store, StoreUnavailable

logger = log.get("hbmwatch.api.exporter")

#: Alerts and incidents resolved longer ago than this are not read at scrape time.
LIVE_LOOKBACK_MS = 3_600_000
#: Families that a running component registers itself (the dispatcher counts its sends).
SELF_REGISTERED = frozenset({"hbmwatch_alert_notifications_total"})


def _family(definition: MetricDef, labels: Iterable[str] | None = None) -> Metric:
    names = list(definition.labels if labels is None else labels)
    if definition.is_counter:
        return CounterMetricFamily(
            definition.name.removesuffix("_total"), definition.help, labels=names
        )
    return GaugeMetricFamily(definition.name, definition.help, labels=names)


def _filled(name: str, values: Iterable[LabelledValue]) -> Metric:
    definition = EXPORTED[name]
    family = _family(definition)
    for item in values:
        family.add_metric([item.labels.get(k, "") for k in definition.labels], item.value)
    return family


class Exporter(Collector):
    """A custom collector: computed at each scrape, nothing kept between scrapes."""

    def __init__(self, store: Store, status: ServiceStatus, *, dispatcher_registered: bool) -> None:
        self.store = store
        self.status = status
        self.dispatcher_registered = dispatcher_registered

    def collect(self) -> Iterator[Metric]:
        yield from self._snapshot()
        yield from self._detection_health()
        try:
            yield from self._alerting()
            yield from self._targets()
        except StoreUnavailable as exc:  # an outage: one line (rate-limited), no traceback
            logger.warning("exporter could not read the store", error=str(exc))
        except Exception:  # a scrape must answer even when the store does not
            logger.exception("exporter could not read the store")
        if not self.dispatcher_registered:
            yield _family(EXPORTED["hbmwatch_alert_notifications_total"])

    def _snapshot(self) -> Iterator[Metric]:
        snap = self.status.snapshot
        yield _filled("hbmwatch_gpu_thermal_margin_celsius", snap.thermal_margin if snap else ())
        yield _filled("hbmwatch_gpu_anomaly_score", snap.anomaly_score if snap else ())
        yield _filled("hbmwatch_workload_latency_p99_seconds", snap.latency_p99 if snap else ())

    def _detection_health(self) -> Iterator[Metric]:
        lag = _family(EXPORTED["hbmwatch_detection_lag_seconds"])
        cycle = _family(EXPORTED["hbmwatch_detection_cycle_seconds"])
        if (value := self.status.detection_lag_seconds()) is not None:
            lag.add_metric([], value)
        if self.status.last_cycle_seconds is not None:
            cycle.add_metric([], self.status.last_cycle_seconds)
        yield lag
        yield cycle

    def _alerting(self) -> Iterator[Metric]:
        now = self.store.now_ms()
        findings = Counter(
            (f.kind, f.severity.value)
            for f in self.store.findings.query(open_only=True, limit=5000)
        )
        alerts, incidents, _ = self.store.alerts.live(now - LIVE_LOOKBACK_MS)
        live = [a for a in alerts if a.state is not AlertState.RESOLVED]
        by_alert = Counter(
            (a.labels.get("alertname", ""), a.state.value, a.severity.value, str(a.muted).lower())
            for a in live
        )
        kind_of = {a.id: a.labels.get("kind", "") for a in alerts}
        by_incident = Counter(
            (i.severity.value, kind_of.get(i.alerts[0], "") if i.alerts else "", i.state.value)
            for i in incidents
            if i.state is not IncidentState.RESOLVED
        )
        for name, counts in (
            ("hbmwatch_findings_open", findings),
            ("hbmwatch_alerts", by_alert),
            ("hbmwatch_incidents_open", by_incident),
        ):
            family = _family(EXPORTED[name])
            for labels, n in sorted(counts.items()):
                family.add_metric(list(labels), n)
            yield family

    def _targets(self) -> Iterator[Metric]:
        """The collector's per-target health, as last stored (stale after 5 minutes)."""
        for definition in by_scope(Scope.COLLECTOR):
            latest = self.store.latest(Selector(definition.name, ()), lookback=300.0)
            names = sorted({k for v in latest for k, _ in v.series.labels})
            family = _family(definition, names)
            for v in latest:
                labels = v.series.label_dict
                family.add_metric([labels.get(k, "") for k in names], v.value)
            yield family
