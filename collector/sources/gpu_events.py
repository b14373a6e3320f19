"""GPU error events counted per device and code, from exporters that only show the last one.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a gauge of the last XID a GPU raised (0:
none yet); DME's ``gpu_afid_errors`` holds the AFIDs of the last RAS event, one line per
``afid_index``; dcgm-exporter's optional ``DCGM_EXP_XID_ERRORS_COUNT{xid}`` counts each XID
within a sliding window.  None of them is a counter, so the collector keeps one per
``(device, scheme, code)``: ``gpu_error_events_total``.

What each source can and cannot show:

- last-value gauge (XID): one event each time the value changes to a non-zero code.  The
  first page that shows a non-zero value counts it once (it happened since the exporter
  started).  The same code raised again between two scrapes is invisible.
- last-event set (AFID): each distinct AFID of an event once, when the set changes.  The
  same event set raised twice in a row is invisible.
- windowed count (XID count): the rise of each code's count between two scrapes.  An event
  that enters the window while an older one of the same code leaves it is invisible.

A counter series is new when its first event is counted: it gets a 0 one millisecond
before its first value, so ``increase()`` and the detectors see the first event too.  The
totals live in the collector: a collector restart starts them again at 0 (a counter reset).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hbmwatch.collector.translate import Collected
from hbmwatch.records import SeriesKey

DeviceId = tuple[str, str, str, str]
METRIC = "gpu_error_events_total"


class EventCounter:
    """One target's error-event counters, per device, scheme and code."""

    def __init__(self) -> None:
        self._last: dict[tuple[DeviceId, str], object] = {}
        self._totals: dict[tuple[DeviceId, str, int], int] = {}
        self._labels: dict[DeviceId, dict[str, str]] = {}
        self._new: set[tuple[DeviceId, str, int]] = set()

    def last_code(
        self, device: DeviceId, labels: Mapping[str, str], scheme: str, code: int
    ) -> None:
        """A last-value gauge: an event when it changes to a non-zero code."""
        previous = self._last.get((device, scheme))
        self._last[(device, scheme)] = code
        if code != 0 and code != previous:
            self.count(device, labels, scheme, code, 1)

    def last_set(
        self, device: DeviceId, labels: Mapping[str, str], scheme: str, codes: Iterable[int]
    ) -> None:
        """The codes of the last event: each distinct code once when the set changes."""
        current = tuple(sorted(set(codes)))
        previous = self._last.get((device, scheme))
        self._last[(device, scheme)] = current
        if current and current != previous:
            for code in current:
                self.count(device, labels, scheme, code, 1)

    def window_counts(
        self, device: DeviceId, labels: Mapping[str, str], scheme: str, counts: Mapping[int, int]
    ) -> None:
        """Counts within a sliding window: each code's rise since the last scrape."""
        key = (device, f"{scheme}:window")
        previous = self._last.get(key)
        before: Mapping[int, int] = previous if isinstance(previous, dict) else {}
        self._last[key] = dict(counts)
        for code, n in counts.items():
            rise = n - before.get(code, 0)
            if code != 0 and rise > 0:
                self.count(device, labels, scheme, code, rise)

    def count(
        self, device: DeviceId, labels: Mapping[str, str], scheme: str, code: int, n: int = 1
    ) -> None:
        """``n`` events of ``code`` (a source that reports each event, as NVML's do)."""
        key = (device, scheme, code)
        if key not in self._totals:
            self._totals[key] = 0
            self._new.add(key)
        self._totals[key] += n
        self._labels[device] = dict(labels)

    def emit(self, out: Collected, ts_ms: int) -> None:
        """Every counter seen so far, at ``ts_ms``; a new one with its 0 just before."""
        for (device, scheme, code), total in self._totals.items():
            series = SeriesKey(
                METRIC, {**self._labels[device], "scheme": scheme, "code": str(code)}
            )
            if (device, scheme, code) in self._new:
                out.add(series, ts_ms - 1, 0.0)
            out.add(series, ts_ms, float(total))
        self._new.clear()


def code_of(value: float, out: Collected, what: str) -> int | None:
    """An error code from a page value, or None (dropped and counted) when it is not one.

    >>> out = Collected()
    >>> code_of(79.0, out, "xid"), code_of(-1.0, out, "xid"), code_of(7.5, out, "xid")
    (79, None, None)
    >>> out.dropped["malformed"]
    2
    """
    if value - value != 0:  # NaN or an infinity
        out.drop("non_finite")
        return None
    if value < 0 or value != int(value) or value >= 2**63:
        out.drop("malformed", why=f"{what}: not an error code: {value!r}")
        return None
    return int(value)
