"""The incident page's words: causes and their evidence, entities, times and spans.

A ranked cause is only as good as what backs it.  On-call must see, for each of the top
causes, what it blames (the entity), which series say so, over which window, how far the
candidate leads the latency and how strongly; a cause that carries no evidence is shown as
unconfirmed, never with a confidence bar that reads as certainty.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from hbmwatch.query import MatchOp, parse_selector
from hbmwatch.records import Alert, Evidence, RankedCause
from hbmwatch.validation import InvalidQuery

ENTITY_LABELS = ("cluster", "rack", "host", "gpu", "partition", "service", "model", "phase",
                 "target", "reason", "link", "check")  # fmt: skip
#: Labels that say where a series is, in a short series text (serials and uuids do not).
SHORT_LABELS = ("host", "gpu", "stack", "link", "direction", "domain", "reason", "service",
                "phase", "target")  # fmt: skip
#: What a cause blames, in the order they narrow it (a GPU names its host; rack goes then).
BLAME_LABELS = ("rack", "host", "gpu", "link", "service", "phase", "target")
_SERIES_IN_TEXT = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_PLACE_IN_TEXT = re.compile(r"\b(rack|host|cluster) ([A-Za-z0-9_.:-]+)")


@dataclass(frozen=True)
class EvidenceLine:
    """A piece of evidence: the sentence that says it, and its parts for a table."""

    evidence: Evidence
    sentence: str
    series: str = ""  # the series in a few words; the full text stays in ``evidence``
    measured: str = ""
    window: str = ""
    lag: str = ""
    strength: str = ""


@dataclass(frozen=True)
class CauseView:
    """A ranked cause as shown: ``supported`` is False when no evidence backs it."""

    cause: str
    confidence: float
    summary: str
    evidence: tuple[EvidenceLine, ...]
    entity: str = ""
    supported: bool = True

    @property
    def confidence_text(self) -> str:
        """``82% confidence``; an unsupported cause is never worded as confident."""
        if self.supported:
            return f"{self.confidence:.0%} confidence"
        return f"unconfirmed: no evidence recorded (ranked at {self.confidence:.0%})"


@dataclass(frozen=True)
class Entity:
    """Something the incident's alerts name (a GPU, a rack, a workload), with their names."""

    labels: tuple[tuple[str, str], ...]
    alertnames: tuple[str, ...]

    @property
    def text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels)


def series_in(text: str) -> str | None:
    """The ``metric{...}`` selector inside an evidence series text, if there is one.

    >>> series_in('load-adjusted rise of gpu_memory_temperature_celsius{host="n1",gpu="0"}')
    'gpu_memory_temperature_celsius{host="n1",gpu="0"}'
    >>> series_in("GPUs of rack r0") is None
    True
    """
    m = _SERIES_IN_TEXT.search(text)
    return m.group(0) if m else None


# -- causes ----------------------------------------------------------------------------------
def cause_view(c: RankedCause) -> CauseView:
    lines = tuple(evidence_line(e) for e in c.evidence)
    return CauseView(str(c.cause), c.confidence, c.summary, lines, cause_entity(c),
                     supported=bool(c.evidence))  # fmt: skip


def cause_entity(c: RankedCause) -> str:
    """What a cause blames, read from its evidence: ``host n1 gpu 0``, ``rack r0``.

    The cause's own ``entity`` where the ranker gives one; else a place its evidence names
    in words (a rack's cooling is the rack's), else the labels its evidence series share.

    >>> cause_entity(RankedCause("thermal", 0.8, (Evidence('t{host="n1",gpu="0"}', "s", 1),)))
    'host n1 gpu 0'
    >>> cause_entity(RankedCause("cooling", 0.8, (Evidence("GPUs of rack r0", "f", 0.9),)))
    'rack r0'
    """
    named = dict(getattr(c, "entity", None) or {})  # the ranker's own word, where it gives one
    if named:
        return _blame(named)
    for e in c.evidence:  # a place named in words is the cause's own scope ("rack r0")
        m = _PLACE_IN_TEXT.search(e.series)
        if m:
            return f"{m.group(1)} {m.group(2)}"
    common: dict[str, str] | None = None
    for e in c.evidence:
        labels = _labels_of(e.series)
        if labels is None:
            continue
        common = labels if common is None else {
            k: v for k, v in common.items() if labels.get(k) == v
        }  # fmt: skip
    return _blame(common or {})


def _blame(labels: dict[str, str]) -> str:
    """``host n1 gpu 0`` (a host needs no rack), ``rack r0``, ``cluster c0``."""
    if labels.get("host"):
        labels = {k: v for k, v in labels.items() if k != "rack"}
    words = " ".join(f"{k} {labels[k]}" for k in BLAME_LABELS if labels.get(k))
    if not words and labels.get("cluster"):
        return f"cluster {labels['cluster']}"
    return words


def _labels_of(text: str) -> dict[str, str] | None:
    selector = series_in(text)
    if selector is None:
        return None
    try:
        parsed = parse_selector(selector)
    except InvalidQuery:
        return None
    return {m.label: m.value for m in parsed.matchers if m.op is MatchOp.EQ}


def _num(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.4g}"


def evidence_line(e: Evidence) -> EvidenceLine:
    """The sentence, and the measured value, window, lag and strength on their own."""
    measured = f"{e.statistic} = {_num(e.value)}"
    if e.threshold is not None and math.isfinite(e.threshold):
        measured += f" (threshold {_num(e.threshold)})"
    window = ""
    if e.window_start_ms is not None and e.window_end_ms is not None:
        window = f"{utc_time(e.window_start_ms)} to {utc_time(e.window_end_ms)} UTC"
    lag = "" if e.lag_seconds is None else f"{_num(e.lag_seconds)} s"
    strength = "" if e.strength is None else _num(e.strength)
    return EvidenceLine(e, evidence_sentence(e), short_series(e.series), measured, window, lag,
                        strength)  # fmt: skip


def short_series(text: str) -> str:
    """An evidence series in a few words: its metric and the labels that say where.

    >>> short_series('rise of t_celsius{cluster="c0",host="n1",gpu="3",serial="42",uuid="f"}')
    'rise of t_celsius host=n1 gpu=3'
    >>> short_series("GPUs of rack r0")
    'GPUs of rack r0'
    """
    selector = series_in(text)
    labels = _labels_of(text) if selector else None
    if selector is None or labels is None:
        return text
    where = SHORT_LABELS if labels.get("host") else ("rack", *SHORT_LABELS)
    words = " ".join(f"{k}={labels[k]}" for k in where if labels.get(k))
    head, _, tail = text.partition(selector)
    metric = selector.split("{", 1)[0]
    return f"{head}{metric} {words}{tail}".strip()


def evidence_sentence(e: Evidence) -> str:
    """One piece of evidence in words: statistic, value against threshold, window, lag.

    >>> evidence_sentence(Evidence("s", "max_rise_c", 7.5, 5, lag_seconds=10, strength=0.9))
    'max_rise_c was 7.5, above its threshold of 5; it leads the latency by 10 s (correlation 0.9)'
    """
    text = f"{e.statistic} was {_num(e.value)}"
    if e.threshold is not None and math.isfinite(e.threshold) and math.isfinite(e.value):
        side = "above" if e.value > e.threshold else "at" if e.value == e.threshold else "below"
        text += f", {side} its threshold of {_num(e.threshold)}"
    if e.window_start_ms is not None and e.window_end_ms is not None:
        text += f", over {utc_time(e.window_start_ms)} to {utc_time(e.window_end_ms)} UTC"
    lead = []
    if e.lag_seconds is not None:
        lead.append(f"it leads the latency by {_num(e.lag_seconds)} s")
    if e.strength is not None:
        lead.append(f"correlation {_num(e.strength)}")
    if lead:
        text += "; " + (lead[0] + (f" ({lead[1]})" if len(lead) > 1 else ""))
    return text + (f"; {e.note}" if e.note else "")


def entities_of(alerts: Sequence[Alert]) -> tuple[Entity, ...]:
    """The distinct entities the alerts name, each with the alert names raised on it."""
    found: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for a in alerts:
        key = tuple((k, a.labels[k]) for k in ENTITY_LABELS if a.labels.get(k))
        names = found.setdefault(key, [])
        name = a.labels.get("alertname", "")
        if name and name not in names:
            names.append(name)
    return tuple(Entity(k, tuple(v)) for k, v in found.items())


# -- times -----------------------------------------------------------------------------------
def utc(ms: int | None) -> str:
    """``2027-01-15 08:00:00 UTC``."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def duration(ms: int) -> str:
    """``1 h 5 min``, ``12 min``, ``40 s``: spans as people say them.

    >>> duration(3_900_000), duration(720_000), duration(40_000), duration(90_061_000)
    ('1 h 5 min', '12 min', '40 s', '1 d 1 h')
    """
    s = max(int(ms // 1000), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def relative(ms: int | None, now_ms: int) -> str:
    """``12 min ago`` or ``in 3 min``, from the store's clock."""
    if ms is None:
        return ""
    delta = now_ms - ms
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"
