"""NVIDIA dcgm-exporter pages -> canonical samples.

Reads both generations of field names (before and after DCGM 4.6) and both spellings of
the host label (``Hostname``, ``hostname``), drops and counts DCGM's not-supported
sentinels, decodes the clocks-event-reasons bitmask into one active flag per throttle
reason, and maps MIG instances (``GPU_I_ID``, ``GPU_I_PROFILE``) onto partitions.  XIDs
become counted events (``collector/sources/gpu_events.py``), the exporter's health watches
``gpu_health_status``; row remapping and retired pages are plain families.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from hbmwatch.collector.exposition import SeriesRef
from hbmwatch.collector.sources.gpu_events import EventCounter, code_of
from hbmwatch.collector.spellings import dcgm as spelling
from hbmwatch.collector.translate import (
    Collected,
    LineTranslator,
    Mapped,
    add_fallbacks,
    device_for,
)
from hbmwatch.records import Device, Sample, SeriesKey

_ERROR_LINES = frozenset({*spelling.XID_FIELDS, spelling.XID_COUNT, spelling.HEALTH_STATUS})
_ERROR_SPECIALS = frozenset({"health", "xid_window", "xid_last"})


class DcgmTranslator(LineTranslator):
    kind = "dcgm"
    sentinel_floor = 2_147_483_632.0  # the smallest of DCGM's blank values
    is_sentinel = staticmethod(spelling.is_sentinel)

    def __init__(
        self, static_labels: Mapping[str, str] | None = None, *, series_cap: int = 200_000
    ) -> None:
        super().__init__(series_cap)
        self.static = dict(static_labels or {})
        self._events = EventCounter()

    def _device(self, labels: dict[str, str]) -> Device | None:
        gpu = labels.get("gpu")
        host = labels.get("hostname") or labels.get("Hostname") or ""
        if gpu is None or not (gpu.isascii() and gpu.isdigit()):
            return None
        device = device_for(
            self.static,
            host=host,
            gpu=gpu,
            vendor="nvidia",
            model=labels.get("modelName", ""),
            partition=labels.get("GPU_I_ID", ""),
            uuid=labels.get("UUID", "").removeprefix("GPU-"),
            serial=labels.get("DCGM_FI_DEV_SERIAL", ""),
            compute_partition=labels.get("GPU_I_PROFILE", ""),
            driver=labels.get("DCGM_FI_DRIVER_VERSION", ""),
        )
        return device if device.host else None

    def _map(self, series: SeriesRef) -> Mapped:
        name = series.name
        labels = series.label_dict()
        family = spelling.BY_NAME.get(name)
        bitmask = name in spelling.REASONS_FIELDS
        if name in _ERROR_LINES:
            return self._map_error(name, labels)
        if family is None and not bitmask:
            return Mapped(None, drop="ignored" if name in spelling.IGNORED else "unmapped")
        device = self._device(labels)
        if device is None:
            return Mapped(None, drop="no_device")
        self._devices.setdefault(device.identity, device)
        if bitmask:
            return Mapped(
                SeriesKey("gpu_throttle_active", device.labels()),
                special="bitmask",
                device=device.identity,
            )
        assert family is not None and family.metric is not None
        key = SeriesKey(family.metric, {**device.labels(), **family.labels})
        return Mapped(key, family.scale, priority=family.priority, device=device.identity)

    def _map_error(self, name: str, labels: dict[str, str]) -> Mapped:
        """XID and health lines: stateful or checked values, handled in ``_finish``."""
        device = self._device(labels)
        if device is None:
            return Mapped(None, drop="no_device")
        self._devices.setdefault(device.identity, device)
        base = device.labels()
        if name == spelling.HEALTH_STATUS:
            check = spelling.HEALTH_WATCHES.get(labels.get("health_watch", "ALL").upper())
            if check is None:
                return Mapped(None, drop="unmapped")
            key = SeriesKey("gpu_health_status", {**base, "check": check})
            return Mapped(key, special="health", device=device.identity)
        if name == spelling.XID_COUNT:
            xid = labels.get("xid", "")
            if not (xid.isascii() and xid.isdigit()):
                return Mapped(None, drop="malformed")
            key = SeriesKey("gpu_error_events_total", {**base, "code": str(int(xid))})
            return Mapped(key, special="xid_window", device=device.identity)
        key = SeriesKey("gpu_error_events_total", base)
        return Mapped(key, special="xid_last", device=device.identity)

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        out = super().translate_text(text, ts_ms)
        out.devices = dict(self._devices)
        return out

    def _finish(self, out: Collected, special: list[tuple[Mapped, float]], ts_ms: int) -> None:
        fallback, errors = [], []
        for m, value in special:
            if value - value != 0:  # NaN or an infinity: no bitmask, no value
                out.drop("non_finite")
            elif spelling.is_sentinel(value):
                out.drop("sentinel")
            elif m.special == "bitmask":
                if value < 0 or value != int(value):
                    out.drop("malformed", why=f"clocks-event-reasons bitmask {value!r}")
                else:
                    self._decode(out, m.key, int(value), ts_ms)  # type: ignore[arg-type]
            elif m.special in _ERROR_SPECIALS:
                errors.append((m, value))
            else:
                fallback.append((m, value))
        add_fallbacks(out, fallback, ts_ms)
        if errors:
            self._errors(out, errors, ts_ms)

    def _errors(self, out: Collected, lines: list[tuple[Mapped, float]], ts_ms: int) -> None:
        """Health verdicts (the worst of two watches that share a check) and XID events:
        the windowed count where the exporter has it, else the last-XID gauge."""
        health: dict[SeriesKey, float] = {}
        windows: dict[tuple[str, str, str, str], dict[int, int]] = {}
        last: list[tuple[Mapped, int]] = []
        for m, value in lines:
            assert m.key is not None and m.device is not None
            if m.special == "health":
                status = spelling.HEALTH_RESULTS.get(value)  # type: ignore[call-overload]
                if status is None:
                    out.drop("malformed", why=f"DCGM health result {value!r}")
                else:
                    health[m.key] = max(status, health.get(m.key, 0.0))
                continue
            code = code_of(value, out, "XID")
            if code is None:
                continue
            if m.special == "xid_window":
                windows.setdefault(m.device, {})[int(m.key.label("code"))] = code
            else:
                last.append((m, code))
        for key, status in health.items():
            out.add(key, ts_ms, status)
        for device, counts in windows.items():
            self._events.window_counts(device, self._devices[device].labels(), "xid", counts)
        for m, code in last:
            assert m.key is not None and m.device is not None
            if m.device not in windows:
                self._events.last_code(m.device, m.key.label_dict, "xid", code)
        self._events.emit(out, ts_ms)

    @staticmethod
    @functools.cache
    def _reason_keys(base: SeriesKey) -> tuple[tuple[int, SeriesKey], ...]:
        return tuple(
            (bit, base.with_labels(reason=reason)) for bit, reason in spelling.THROTTLE_BITS.items()
        )

    @classmethod
    def _decode(cls, out: Collected, base: SeriesKey, bits: int, ts_ms: int) -> None:
        """One active flag per throttle reason from the clocks-event-reasons bitmask.

        >>> out = Collected()
        >>> DcgmTranslator._decode(out, SeriesKey("gpu_throttle_active", {"gpu": "0"}), 0x24, 0)
        >>> sorted((s.series.label("reason"), s.value) for s in out.samples)[:3]
        [('hw_slowdown', 0.0), ('hw_thermal', 0.0), ('power', 1.0)]
        """
        samples = out.samples
        for bit, key in cls._reason_keys(base):
            samples.append(Sample(key, ts_ms, 1.0 if bits & bit else 0.0))
