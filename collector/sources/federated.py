"""Bring your own Prometheus: vendor series read back from a Prometheus that scraped them.

A target of kind ``prometheus`` names a Prometheus (or VictoriaMetrics) server.  Each
scrape reads its ``/federate`` with one ``match[]`` selector per source read (``dcgm``,
``dme``, ``inference``), the exact series names those sources' translators know, drawn
from the same spelling tables (``ROUTES``).  Each series goes, by its name, to the
translator the scraping collector would have used for its exporter's page: one translator
per exporter instance (``job``, ``instance`` and identity), so per-target state (DME tick
periods, latency-histogram windows, the device inventory) works as when scraping.

Federate lines carry the time the user's Prometheus scraped them; that time is kept, and a
series' sample no newer than the last one taken is skipped, so reading an unchanged value
twice writes it once.  ``job`` and ``instance`` are Prometheus' labels, not the exporter's:
they are taken off before translation.  A series' host is its ``host_label`` if set, else
dcgm-exporter's ``Hostname`` (or DME's ``hostname``), else the host part of ``instance``;
its cluster and rack are its own ``cluster`` and ``rack`` labels, else the target's.

Prometheus' own ``up`` of an exporter whose series have been read becomes that exporter's
``hbmwatch_target_up``, so a dead exporter is reported as when hbmwatch scrapes it.  An
``up`` belongs to the exporter whose series carry all its labels (``job`` and ``instance``
do not tell apart the pages of one port: vLLM services, training jobs); its ``target`` is
``job/instance`` and the other target labels, as Prometheus shows the target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hbmwatch.collector.attribution import federated_labels
from hbmwatch.collector.exposition import SeriesCache, SeriesRef, parse
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.spellings import dcgm, dme, vllm
from hbmwatch.collector.translate import Collected
from hbmwatch.records import Sample, SeriesKey

#: What a ``prometheus`` target reads by default: every source below.
SOURCES = ("dcgm", "dme", "inference")
#: Labels Prometheus adds to what it scraped; the exporter's page never had them.
FEDERATION_LABELS = frozenset({"job", "instance"})
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def _routes() -> dict[str, str]:
    """Every series name a source's translator reads -> that source."""
    routes = dict.fromkeys((*dcgm.BY_NAME, *dcgm.REASONS_FIELDS), "dcgm")
    routes.update((prefix + name, "dme") for prefix in dme.PREFIXES for name in dme.BY_NAME)
    for family in vllm.PHASE_OF:
        routes.update((family + suffix, "inference") for suffix in _HISTOGRAM_SUFFIXES)
    routes.update(dict.fromkeys(vllm.TRITON_SUMMARIES, "inference"))
    return routes


ROUTES: dict[str, str] = _routes()


def selectors(sources: Iterable[str]) -> list[str]:
    """One ``match[]`` selector per source: its exact series names, as one regex.

    >>> selectors(["dcgm"])[0].startswith('{__name__=~"DCGM_FI_')
    True
    """
    out = []
    for source in sources:
        names = sorted(name for name, s in ROUTES.items() if s == source)
        out.append('{__name__=~"' + "|".join(names) + '"}')
    return [*out, "up"]


def federate_url(url: str) -> str:
    """The server's ``/federate``: a bare server URL gets the path added.

    >>> federate_url("http://prom:9090"), federate_url("http://vm:8428/federate")
    ('http://prom:9090/federate', 'http://vm:8428/federate')
    """
    if urlsplit(url).path.rstrip("/").endswith("/federate"):
        return url
    return url.rstrip("/") + "/federate"


def instance_host(instance: str) -> str:
    """The host part of Prometheus' ``instance`` label.

    >>> instance_host("10.0.0.7:9400"), instance_host("[::1]:9400"), instance_host("node7")
    ('10.0.0.7', '::1', 'node7')
    """
    try:
        return urlsplit("//" + instance).hostname or ""
    except ValueError:
        return ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series_text(name: str, labels: Iterable[tuple[str, str]]) -> str:
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


@dataclass(frozen=True, slots=True)
class _Route:
    """Where one federate series goes, worked out the first time it is read."""

    source: str | None  # None: dropped as unmapped; "up": an exporter's health
    exporter: tuple[str, str] = ("", "")  # job, instance
    translator: tuple[Any, ...] = ()  # key of the exporter's translator
    series: str = ""  # the series as its exporter's page showed it (no job, instance)
    labels: Mapping[str, str] | None = None
    identity: Mapping[str, str] | None = None


UNMAPPED = _Route(None)


class FederatedTranslator:
    """One ``prometheus`` target: the federate page split into per-exporter pages."""

    kind = "prometheus"

    def __init__(
        self,
        static_labels: Mapping[str, str] | None = None,
        *,
        sources: Iterable[str] = SOURCES,
        host_label: str | None = None,
        window_seconds: float = 60.0,
        series_cap: int = 200_000,
    ) -> None:
        self.static = dict(static_labels or {})
        self.sources = tuple(sources)
        self.host_label = host_label
        self.window_seconds = window_seconds
        self.series_cap = series_cap
        self.params = [("match[]", s) for s in selectors(self.sources)]
        self._series = SeriesCache(series_cap)
        self._routes: dict[str, _Route] = {}  # federate line key -> its route
        self._by_exporter: dict[tuple[str, str], list[_Route]] = {}
        self._last: dict[str, int] = {}  # federate line key -> newest timestamp taken
        self._translators: dict[tuple[Any, ...], Any] = {}
        #: An ``up`` series' labels -> the health labels of its exporter, once matched.
        self._health: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

    def request(self, url: str) -> tuple[str, list[tuple[str, str]]]:
        """What to fetch for the target at ``url``: its ``/federate`` and the selectors."""
        return federate_url(url), self.params

    def clear(self) -> None:
        self._series.clear()
        self._routes.clear()
        self._by_exporter.clear()
        for translator in self._translators.values():
            translator.clear()

    def identity(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Cluster, rack and host of one series (see the module's docstring)."""
        host = labels.get(self.host_label, "") if self.host_label else ""
        host = host or labels.get("Hostname") or labels.get("hostname") or ""
        out = {k: labels.get(k) or self.static.get(k, "") for k in ("cluster", "rack")}
        out["host"] = host or instance_host(labels.get("instance", ""))
        return {k: v for k, v in out.items() if v}

    def _route(self, series: SeriesRef) -> _Route:
        source = "up" if series.name == "up" else ROUTES.get(series.name)
        if source is None or (source != "up" and source not in self.sources):
            return UNMAPPED
        labels = series.label_dict()
        exporter = (labels.get("job", ""), labels.get("instance", ""))
        if source == "up":
            return _Route("up", exporter, labels=labels)
        identity = self.identity(labels)
        page_labels = federated_labels(
            (k, v) for k, v in series.labels if k not in FEDERATION_LABELS
        )
        route = _Route(
            source,
            exporter,
            (source, exporter, tuple(identity.items())),
            _series_text(series.name, page_labels),
            labels,
            identity,
        )
        self._by_exporter.setdefault(exporter, []).append(route)
        return route

    def _translator(self, key: tuple[Any, ...]) -> Any:
        translator = self._translators.get(key)
        if translator is None:
            source, _, identity = key
            identity, cap = dict(identity), self.series_cap
            if source == "dcgm":
                translator = DcgmTranslator(identity, series_cap=cap)
            elif source == "dme":
                translator = DmeTranslator(identity, series_cap=cap)
            else:
                window = self.window_seconds
                translator = InferenceTranslator(identity, window_seconds=window, series_cap=cap)
            self._translators[key] = translator
        return translator

    def _health_of(self, up: _Route) -> dict[str, str] | None:
        """The health labels of the exporter an ``up`` series is of: the first series read
        from its ``job`` and ``instance`` that carries all of ``up``'s labels."""
        assert up.labels is not None
        signature = tuple(sorted((k, v) for k, v in up.labels.items() if k != "__name__"))
        health = self._health.get(signature)
        if health is not None:
            return health
        for route in self._by_exporter.get(up.exporter, ()):
            assert route.labels is not None and route.identity is not None
            if all(route.labels.get(k) == v for k, v in signature):
                rest = ",".join(f"{k}={v}" for k, v in signature if k not in FEDERATION_LABELS)
                target = "/".join(up.exporter) + (f"{{{rest}}}" if rest else "")
                health = {**route.identity, "target": target, "source": str(route.source)}
                self._health[signature] = health
                return health
        return None

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        page = parse(text, self._series)
        out = Collected()
        if page.malformed:
            out.drop("malformed", page.malformed, "; ".join(page.first_errors))
        if page.series_capped:
            out.drop("series_cap", page.series_capped)
        pages: dict[tuple[int, tuple[Any, ...]], list[str]] = {}
        ups: list[tuple[_Route, int, float]] = []
        last, routes = self._last, self._routes
        for sample in page.samples:
            route = routes.get(sample.key)
            if route is None:
                route = routes[sample.key] = self._route(sample.series)
            if route.source is None:
                out.dropped["unmapped"] += 1
                continue
            ts = ts_ms if sample.timestamp_ms is None else sample.timestamp_ms
            if last.get(sample.key, ts - 1) >= ts:  # read before: not a new sample
                continue
            last[sample.key] = ts
            if route.source == "up":
                ups.append((route, ts, sample.value))
                continue
            lines = pages.get((ts, route.translator))
            if lines is None:
                lines = pages[ts, route.translator] = []
            lines.append(f"{route.series} {sample.value!r}")
        for (ts, key), lines in sorted(pages.items(), key=lambda kv: kv[0][0]):
            collected = self._translator(key).translate_text("\n".join(lines), ts)
            out.samples.extend(collected.samples)
            out.dropped.update(collected.dropped)
            out.devices.update(collected.devices)
            out.errors.extend(collected.errors[: max(0, 5 - len(out.errors))])
        for route, ts, value in ups:
            if (health := self._health_of(route)) is not None:
                out.samples.append(Sample(SeriesKey("hbmwatch_target_up", health), ts, value))
        if len(last) > 2 * len(page.samples) + 10_000:  # forget series gone from the server
            keep = {s.key for s in page.samples}
            self._last = {k: v for k, v in last.items() if k in keep}
        return out
