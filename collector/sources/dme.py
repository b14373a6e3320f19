"""AMD Device Metrics Exporter pages -> canonical samples.

Handles current and old builds: the optional ``amd_`` name prefix, upper-case label names
of old builds, accumulators typed as gauges (read as counters), CPX partitions (physical
sensors on partition 0 are the physical GPU's; activity and memory per partition),
per-stack ``gpu_hbm_temperature{hbm_index}``, and the violation accumulators, converted
from ticks of ``gpu_violation_current_accumulated_counter`` into seconds.
"""

from __future__ import annotations

from collections.abc import Mapping

from hbmwatch.collector.exposition import SeriesRef
from hbmwatch.collector.sources.gpu_events import EventCounter, code_of
from hbmwatch.collector.spellings import Family
from hbmwatch.collector.spellings import dme as spelling
from hbmwatch.collector.translate import (
    PARTITIONS,
    Collected,
    LineTranslator,
    Mapped,
    TickPeriod,
    add_fallbacks,
    device_for,
)
from hbmwatch.records import Device, SeriesKey


class DmeTranslator(LineTranslator):
    """One DME target's translator; keeps its memo and tick-period estimates."""

    kind = "dme"

    def __init__(
        self, static_labels: Mapping[str, str] | None = None, *, series_cap: int = 200_000
    ) -> None:
        super().__init__(series_cap)
        self.static = dict(static_labels or {})
        self._gpu_index: dict[str, str] = {}  # serial/uuid -> index, for builds without gpu_id
        self._ticks = TickPeriod()
        self._events = EventCounter()

    # -- mapping one series (cached per line) ---------------------------------------------
    def _labels(self, series: SeriesRef) -> dict[str, str]:
        return {spelling.LEGACY_LABELS.get(k, k): v for k, v in series.labels}

    def _family(self, name: str) -> Family | None:
        for prefix in spelling.PREFIXES:
            if prefix and name.startswith(prefix):
                name = name[len(prefix) :]
            family = spelling.BY_NAME.get(name)
            if family is not None:
                return family
        return None

    def _device(self, labels: dict[str, str], physical: bool) -> tuple[Device, bool] | None:
        mode = labels.get("gpu_compute_partition_type", "").lower()
        parts = PARTITIONS.get(mode, 1)
        logical = labels.get("gpu_id")
        ident = labels.get("serial_number") or labels.get("gpu_uuid")
        if logical is not None and logical.isascii() and logical.isdigit():
            gpu = str(int(logical) // parts)
            part_id = labels.get("gpu_partition_id", str(int(logical) % parts))
        elif ident:
            gpu = self._gpu_index.setdefault(ident, str(len(self._gpu_index)))
            part_id = labels.get("gpu_partition_id", "0")
        else:
            return None
        partition = "" if parts == 1 or physical else part_id
        device = device_for(
            self.static,
            host=labels.get("hostname", ""),
            gpu=gpu,
            vendor="amd",
            model=labels.get("card_model", ""),
            partition=partition,
            uuid=labels.get("gpu_uuid", ""),
            serial=labels.get("serial_number", ""),
            compute_partition=mode,
            memory_partition=labels.get("gpu_memory_partition_type", "").lower(),
            driver=labels.get("driver_version", ""),
        )
        if not device.host:
            return None
        return device, part_id != "0"

    def _map(self, series: SeriesRef) -> Mapped:
        bare = series.name.removeprefix("amd_")
        if bare in (spelling.AFID_ERRORS, spelling.HEALTH):
            return self._map_error(bare, self._labels(series))
        family = self._family(series.name)
        if family is None:
            bare = series.name.removeprefix("amd_")
            return Mapped(None, drop="ignored" if bare in spelling.IGNORED else "unmapped")
        labels = self._labels(series)
        found = self._device(labels, family.physical)
        if found is None:
            return Mapped(None, drop="no_device")
        device, other_partition = found
        if family.physical and other_partition:
            return Mapped(None, drop="ignored")  # CPX: physical sensors belong to partition 0
        self._devices.setdefault(device.identity, device)
        extra = dict(family.labels)
        if family.index_label is not None:
            vendor_label, canonical = family.index_label
            if vendor_label not in labels:
                return Mapped(None, drop="malformed")
            extra[canonical] = labels[vendor_label]
        if family.value_labels is not None:
            vendor_label, canonical, values = family.value_labels
            value = values.get(labels.get(vendor_label, "").lower())
            if value is None:
                return Mapped(None, drop="unmapped")
            extra[canonical] = value
        special = None
        if family.name == spelling.ACCUMULATION_COUNTER:
            return Mapped(None, special="tick_counter", device=device.identity)
        if family.name.endswith("_residency_accumulated"):
            special = "ticks"
        elif family.name.endswith("_residency_percentage"):
            special = "percent_active"
        key = SeriesKey(family.metric or "", {**device.labels(), **extra})
        return Mapped(
            key, family.scale, special=special, priority=family.priority, device=device.identity
        )

    def _map_error(self, name: str, labels: dict[str, str]) -> Mapped:
        """AFID and health lines belong to the physical GPU (partition 0 under CPX)."""
        found = self._device(labels, physical=True)
        if found is None:
            return Mapped(None, drop="no_device")
        device, other_partition = found
        if other_partition:
            return Mapped(None, drop="ignored")
        self._devices.setdefault(device.identity, device)
        if name == spelling.HEALTH:
            key = SeriesKey("gpu_health_status", {**device.labels(), "check": "overall"})
            return Mapped(key, special="health", device=device.identity)
        key = SeriesKey("gpu_error_events_total", device.labels())
        return Mapped(key, special="afid", device=device.identity)

    def _errors(self, out: Collected, lines: list[tuple[Mapped, float]], ts_ms: int) -> None:
        """The health verdict, and each device's AFID set counted when it changes."""
        afids: dict[tuple[str, str, str, str], tuple[Mapped, list[int]]] = {}
        for m, value in lines:
            assert m.key is not None and m.device is not None
            if m.special == "health":
                status = spelling.HEALTH_STATUS.get(value)
                if value - value != 0:
                    out.drop("non_finite")
                elif status is None:
                    out.drop("malformed", why=f"gpu_health {value!r}")
                else:
                    out.add(m.key, ts_ms, status)
                continue
            code = code_of(value, out, "AFID")
            if code is not None:
                afids.setdefault(m.device, (m, []))[1].append(code)
        for device, (m, codes) in afids.items():
            assert m.key is not None
            self._events.last_set(device, m.key.label_dict, "afid", codes)
        self._events.emit(out, ts_ms)

    # -- one scrape: the special lines ------------------------------------------------------
    def translate_text(self, text: str, ts_ms: int) -> Collected:
        out = super().translate_text(text, ts_ms)
        out.devices = dict(self._devices)
        return out

    def _finish(self, out: Collected, special: list[tuple[Mapped, float]], ts_ms: int) -> None:
        ticks: dict[object, float] = {}
        for m, value in special:
            if m.special != "tick_counter":
                continue
            if value - value != 0:  # NaN or an infinity measures no tick period
                out.drop("non_finite")
            else:
                ticks[m.device] = value
        fallback, errors = [], []
        for m, value in special:
            if m.special in ("afid", "health"):
                errors.append((m, value))
            elif m.special == "ticks":
                period = (
                    self._ticks.observe(m.device, ts_ms, ticks[m.device])
                    if m.device in ticks
                    else TickPeriod.DEFAULT
                )
                out.add(m.key, ts_ms, value * period)  # type: ignore[arg-type]
            elif m.special == "percent_active":
                out.add(m.key, ts_ms, 1.0 if value > 0 else 0.0)  # type: ignore[arg-type]
            elif m.priority:
                fallback.append((m, value))
        add_fallbacks(out, fallback, ts_ms)
        if errors:
            self._errors(out, errors, ts_ms)
