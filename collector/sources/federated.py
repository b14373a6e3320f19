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
from typing import Any
from urllib.parse import urlsplit

from hbmwatch.collector.exposition import SeriesCache, parse
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


def _line(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{name}{{{inner}}} {value!r}"


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
        self._last: dict[str, int] = {}  # federate line key -> newest timestamp taken
        self._translators: dict[tuple[Any, ...], Any] = {}
        #: An ``up`` series' labels -> the health labels of its exporter, once matched.
        self._health: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

    def request(self, url: str) -> tuple[str, list[tuple[str, str]]]:
        """What to fetch for the target at ``url``: its ``/federate`` and the selectors."""
        return federate_url(url), self.params

    def clear(self) -> None:
        self._series.clear()
        for translator in self._translators.values():
            translator.clear()

    def identity(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Cluster, rack and host of one series (see the module's docstring)."""
        host = labels.get(self.host_label, "") if self.host_label else ""
        host = host or labels.get("Hostname") or labels.get("hostname") or ""
        out = {k: labels.get(k) or self.static.get(k, "") for k in ("cluster", "rack")}
        out["host"] = host or instance_host(labels.get("instance", ""))
        return {k: v for k, v in out.items() if v}

    def _translator(self, key: tuple[Any, ...]) -> Any:
        source, _, identity = key
        identity = dict(identity)
        translator = self._translators.get(key)
        if translator is None:
            cap = self.series_cap
            if source == "dcgm":
                translator = DcgmTranslator(identity, series_cap=cap)
            elif source == "dme":
                translator = DmeTranslator(identity, series_cap=cap)
            else:
                window = self.window_seconds
                translator = InferenceTranslator(identity, window_seconds=window, series_cap=cap)
            self._translators[key] = translator
        return translator

    def _health_of(
        self,
        up: dict[str, str],
        seen: Mapping[tuple[str, str], list[tuple[dict[str, str], str, dict[str, str]]]],
    ) -> dict[str, str] | None:
        """The health labels of the exporter an ``up`` series is of: the first series read
        this time from its ``job`` and ``instance`` that carries all of ``up``'s labels."""
        up.pop("__name__", None)
        signature = tuple(sorted(up.items()))
        health = self._health.get(signature)
        if health is not None:
            return health
        exporter = (up.get("job", ""), up.get("instance", ""))
        for labels, source, identity in seen.get(exporter, ()):
            if all(labels.get(k) == v for k, v in signature):
                rest = ",".join(f"{k}={v}" for k, v in signature if k not in FEDERATION_LABELS)
                target = "/".join(exporter) + (f"{{{rest}}}" if rest else "")
                health = self._health[signature] = {**identity, "target": target, "source": source}
                return health
        return None

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        page = parse(text, self._series)
        out = Collected()
        if page.malformed:
            out.drop("malformed", page.malformed, "; ".join(page.first_errors))
        if page.series_capped:
            out.drop("series_cap", page.series_capped)
        pages: dict[tuple[Any, ...], list[str]] = {}
        ups: list[tuple[dict[str, str], int, float]] = []
        seen: dict[tuple[str, str], list[tuple[dict[str, str], str, dict[str, str]]]] = {}
        last = self._last
        for sample in page.samples:
            name = sample.series.name
            source = ROUTES.get(name)
            if name != "up" and (source is None or source not in self.sources):
                out.drop("unmapped")
                continue
            ts = ts_ms if sample.timestamp_ms is None else sample.timestamp_ms
            if last.get(sample.key, ts - 1) >= ts:  # read before: not a new sample
                continue
            last[sample.key] = ts
            labels = sample.series.label_dict()
            exporter = (labels.get("job", ""), labels.get("instance", ""))
            if source is None:  # up
                ups.append((labels, ts, sample.value))
                continue
            identity = self.identity(labels)
            seen.setdefault(exporter, []).append((labels, source, identity))
            page_labels = [(k, v) for k, v in sample.series.labels if k not in FEDERATION_LABELS]
            key = (source, exporter, tuple(identity.items()))
            lines = pages.setdefault((ts, key), [])
            lines.append(_line(sample.series.name, page_labels, sample.value))
        for (ts, key), lines in sorted(pages.items(), key=lambda kv: kv[0][0]):
            collected = self._translator(key).translate_text("\n".join(lines), ts)
            out.samples.extend(collected.samples)
            out.dropped.update(collected.dropped)
            out.devices.update(collected.devices)
            out.errors.extend(collected.errors[: max(0, 5 - len(out.errors))])
        for labels, ts, value in ups:
            if (health := self._health_of(labels, seen)) is not None:
                out.samples.append(Sample(SeriesKey("hbmwatch_target_up", health), ts, value))
        if len(last) > 2 * len(page.samples) + 10_000:  # forget series gone from the server
            keep = {s.key for s in page.samples}
            self._last = {k: v for k, v in last.items() if k in keep}
        return out
