"""GPU errors through NVML in-process: XID events, row remapping, retired pages.

XIDs arrive as NVML events.  The event set registers the XID critical-error type only:
registering every supported type on a real H200 brought about 7 clock-change events a
second and no XID (docs/device-runs/2026-11-27-h200-cold-start); ECC errors are already
read as counters (``gpu_ecc_errors_total``), and a double-bit error also raises XID 48.
The set is polled with a zero timeout once per collection, so a collection never waits.

Row remapping comes from ``nvmlDeviceGetRemappedRows`` (corrected and uncorrected rows,
pending, failure); retired pages from ``nvmlDeviceGetRetiredPages`` and its pending status,
which Hopper answers NOT_SUPPORTED (it remaps rows instead): skipped quietly, not asked again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hbmwatch.collector.sources.gpu_events import EventCounter
from hbmwatch.collector.translate import Collected
from hbmwatch.records import Device, SeriesKey

#: Events drained per collection at most: an XID storm cannot stall the collector.
MAX_EVENTS = 1000
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event waiting
_RETIREMENT_CAUSES = (("correctable", 0), ("uncorrectable", 1))  # multiple SBE, DBE

TryCall = Callable[..., Any]


class NvmlErrors:
    """One NVML collector's error readings; ``try_`` is the collector's ``_try``."""

    def __init__(self, nvml: Any, try_: TryCall) -> None:
        self.nvml = nvml
        self._try = try_
        self._events = EventCounter()
        self._set: Any = None
        self._by_uuid: dict[str, Device] = {}

    def open(self, devices: Sequence[tuple[Any, Device]]) -> None:
        """An event set with each device's XID events, where the device supports them."""
        n = self.nvml
        wanted = getattr(n, "nvmlEventTypeXidCriticalError", 0x8)
        event_set = self._try("*", "xid_events", n.nvmlEventSetCreate)
        if event_set is None:
            return
        for handle, device in devices:
            supported = self._try(
                device.gpu, "event_types", lambda h=handle: n.nvmlDeviceGetSupportedEventTypes(h)
            )
            if not supported or not supported & wanted:
                continue
            registered = self._try(
                device.gpu,
                "xid_events",
                lambda h=handle: n.nvmlDeviceRegisterEvents(h, wanted, event_set) or True,
            )
            if registered:
                self._by_uuid[device.uuid] = device
        self._set = event_set

    def close(self) -> None:
        if self._set is not None:
            self._try("*", "event_set_free", lambda: self.nvml.nvmlEventSetFree(self._set))
            self._set = None

    def device(self, out: Collected, gpu: str, h: Any, labels: dict[str, str], ts_ms: int) -> None:
        """Row remapping and retired pages of one device."""
        n = self.nvml
        remap = self._try(gpu, "remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
        if remap is not None:
            corrected, uncorrected, pending, failure = remap
            rows = "gpu_row_remaps_total"
            out.add(SeriesKey(rows, {**labels, "severity": "correctable"}), ts_ms, float(corrected))
            out.add(
                SeriesKey(rows, {**labels, "severity": "uncorrectable"}), ts_ms, float(uncorrected)
            )
            out.add(SeriesKey("gpu_row_remap_pending", labels), ts_ms, 1.0 if pending else 0.0)
            out.add(SeriesKey("gpu_row_remap_failed", labels), ts_ms, 1.0 if failure else 0.0)
        for severity, cause in _RETIREMENT_CAUSES:
            pages = self._try(
                gpu, f"retired_pages_{severity}", lambda c=cause: n.nvmlDeviceGetRetiredPages(h, c)
            )
            if pages is not None:
                key = SeriesKey("gpu_retired_pages", {**labels, "severity": severity})
                out.add(key, ts_ms, float(len(pages)))
        pending = self._try(
            gpu, "retired_pages_pending", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h)
        )
        if pending is not None:
            out.add(SeriesKey("gpu_retired_pages_pending", labels), ts_ms, 1.0 if pending else 0.0)

    def poll(self, out: Collected, ts_ms: int) -> None:
        """Drain the XID events waiting (zero timeout) and emit the counters."""
        if self._set is not None:
            for _ in range(MAX_EVENTS):
                event = self._next()
                if event is None:
                    break
                self._record(out, event)
        self._events.emit(out, ts_ms)

    def _next(self) -> Any:
        n = self.nvml
        try:
            return n.nvmlEventSetWait_v2(self._set, 0)
        except n.NVMLError as exc:
            if getattr(exc, "value", None) != getattr(n, "NVML_ERROR_TIMEOUT", _TIMEOUT):
                self.close()  # a broken set is not polled again
            return None

    def _record(self, out: Collected, event: Any) -> None:
        n = self.nvml
        uuid = self._try("*", "event_uuid", lambda: n.nvmlDeviceGetUUID(event.device), quiet=True)
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid or "")
        device = self._by_uuid.get(text.removeprefix("GPU-"))
        code = getattr(event, "eventData", None)
        if device is None or not isinstance(code, int) or code <= 0:
            out.drop("malformed", why=f"NVML XID event {code!r} on {text or 'no device'}")
            return
        self._events.count(device.identity, device.labels(), "xid", code)
