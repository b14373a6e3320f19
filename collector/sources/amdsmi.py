"""amd-smi as a source: ``amd-smi metric --json`` (or its text form, or ``amd-smi monitor``),
and the ``amdsmi`` Python library where it imports.

The command runner and the library module are passed in, so tests run on captured output
and a fake library.  Without ROCm the ``amdsmi`` wheel raises ``KeyError`` (not
``ImportError``) on import; that, like any import failure, becomes ``SourceUnavailable``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from hbmwatch.collector.sources.amdsmi_errors import read_bad_pages
from hbmwatch.collector.spellings import amdsmi as spelling
from hbmwatch.collector.translate import Collected, TickPeriod, device_for
from hbmwatch.records import Device, SeriesKey

Runner = Callable[[list[str]], str]
_VALUE_UNIT = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(\S*)\s*$")
#: ``amd-smi monitor``'s VRAM_USAGE cell, ``"12.3/ 192.0 GB"`` (a bare ``[\d.]+`` let ``1..2``
#: through to ``float()``).
_VRAM = re.compile(r"(\d+(?:\.\d+)?)/\s*(\d+(?:\.\d+)?) GB")


class SourceUnavailable(RuntimeError):
    """A source that cannot run on this host (no driver, no library); says why."""


def run_command(argv: list[str], timeout: float = 10.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SourceUnavailable(f"{argv[0]} is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"{' '.join(argv)} did not answer within {timeout} s") from None
    if done.returncode != 0:
        raise SourceUnavailable(
            f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[:300]}"
        )
    return done.stdout


def leaf(value: Any) -> tuple[float, str] | None:
    """A number and its unit from a JSON leaf, a bare number or a ``"11 W"`` string.

    >>> leaf({"value": 10, "unit": "W"}), leaf("32 GT/s"), leaf("N/A"), leaf(7)
    ((10.0, 'W'), (32.0, 'GT/s'), None, (7.0, ''))
    """
    if isinstance(value, dict) and "value" in value:
        inner = leaf(value["value"])
        return (inner[0], str(value.get("unit") or inner[1])) if inner else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _float(value), ""
    if isinstance(value, str):
        m = _VALUE_UNIT.match(value)
        return (float(m.group(1)), m.group(2)) if m else None
    return None


def _float(value: float) -> float:
    """A JSON number as a float; an integer past float range (``1`` and 400 zeros) is +-inf,
    which ``Collected.add`` then counts as non-finite instead of raising OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def gpus_from_json(text: str) -> list[dict[str, Any]]:
    """The per-GPU records of ``amd-smi metric --json``: a bare list or the envelope."""
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    if not isinstance(data, list) or not all(isinstance(g, dict) for g in data):
        raise ValueError('expected a list of GPU records or {"gpu_data": [...]}')
    return data


def gpus_from_text(text: str) -> list[dict[str, Any]]:
    """``amd-smi metric`` text output parsed into the same tree as its JSON (lower case)."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith(("$", "~", "...")):
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if indent == 0 and key == "gpu":
            gpus.append({"gpu": int(value) if value.isascii() and value.isdigit() else value})
            stack = [(0, gpus[-1])]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value:
            parent[key] = value
        else:
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
    return gpus


def gpus_from_monitor(text: str) -> list[dict[str, Any]]:
    """``amd-smi monitor``'s table, one record per row (logical GPU, XCP)."""
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith(("~", "$"))]
    if not rows:
        return []
    header = rows[0].split()
    out = []
    for line in rows[1:]:
        if line.strip() == "...":
            continue
        cells = re.findall(r"\S+(?: (?:W|°C|MHz|%|GB|MB))?(?:/\s*\S+ GB)?", line)
        if len(cells) != len(header):
            continue
        out.append(dict(zip(header, cells, strict=True)))
    return out


class AmdSmiTranslator:
    """amd-smi records -> canonical samples, for one host."""

    def __init__(self, static_labels: Mapping[str, str] | None = None, *, host: str = "") -> None:
        self.static = dict(static_labels or {})
        self.host = self.static.get("host") or host
        self._ticks = TickPeriod()

    def _device(self, gpu: str, record: Mapping[str, Any]) -> Device:
        asic = record.get("asic", {}) if isinstance(record.get("asic"), dict) else {}
        return device_for(
            self.static,
            host=self.host,
            gpu=gpu,
            vendor="amd",
            model=str(asic.get("market_name", "")),
            serial=str(asic.get("asic_serial", "")),
        )

    def translate(self, gpus: list[dict[str, Any]], ts_ms: int) -> Collected:
        out = Collected()
        for record in gpus:
            gpu = str(record.get("gpu", ""))
            if not (gpu.isascii() and gpu.isdigit()):
                out.drop("no_device")
                continue
            device = self._device(gpu, record)
            out.devices[device.identity] = device
            labels = device.labels()
            self._tree(out, labels, record, (), ts_ms)
            self._throttle(out, device, record.get("throttle"), ts_ms)
        return out

    def _tree(
        self, out: Collected, labels: dict[str, str], node: Any, path: tuple[str, ...], ts_ms: int
    ) -> None:
        if isinstance(node, dict) and "value" not in node:
            for key, child in node.items():
                if path == () and key in ("gpu", "throttle", "asic"):
                    continue
                self._tree(out, labels, child, (*path, str(key).lower()), ts_ms)
            return
        mapped = spelling.PATHS.get(path)
        extra: dict[str, str] = {}
        if (
            mapped is None
            and path[:1] == spelling.HBM_PREFIX[:1]
            and len(path) == 2
            and path[1].startswith(spelling.HBM_PREFIX[1])
        ):
            mapped = ("gpu_hbm_stack_temperature_celsius", {})
            extra = {"stack": path[1].removeprefix(spelling.HBM_PREFIX[1])}
        if mapped is None:
            return
        read = leaf(node)
        if read is None:
            out.drop("unsupported")  # "N/A"
            return
        value, unit = read
        factor = spelling.UNITS.get(unit)
        if factor is None:
            out.drop("unmapped", why=f"{'.'.join(path)}: unknown unit {unit!r}")
            return
        metric, fixed = mapped
        out.add(SeriesKey(metric, {**labels, **fixed, **extra}), ts_ms, value * factor)

    def _throttle(self, out: Collected, device: Device, throttle: Any, ts_ms: int) -> None:
        if not isinstance(throttle, dict):
            return
        counter = leaf(throttle.get("accumulation_counter"))
        period = (
            self._ticks.observe(device.identity, ts_ms, counter[0])
            if counter
            else TickPeriod.DEFAULT
        )
        labels = device.labels()
        for vendor, reason in spelling.VIOLATIONS.items():
            acc = leaf(throttle.get(f"{vendor}_accumulated"))
            if acc is not None:
                out.add(
                    SeriesKey("gpu_throttle_seconds_total", {**labels, "reason": reason}),
                    ts_ms,
                    acc[0] * period,
                )
            status = throttle.get(f"{vendor}_violation_status")
            if isinstance(status, str) and status.upper() in ("ACTIVE", "NOT ACTIVE"):
                out.add(
                    SeriesKey("gpu_throttle_active", {**labels, "reason": reason}),
                    ts_ms,
                    1.0 if status.upper() == "ACTIVE" else 0.0,
                )

    def translate_monitor(self, rows: list[dict[str, str]], ts_ms: int) -> Collected:
        """``amd-smi monitor``: XCP 0 of each physical GPU carries its sensors."""
        out = Collected()
        physical = -1
        for row in rows:
            xcp = row.get("XCP", "0")
            if xcp != "0":
                continue
            physical += 1
            gpu = str(physical) if "XCP" in row else row.get("GPU", str(physical))
            device = device_for(self.static, host=self.host, gpu=gpu, vendor="amd")
            out.devices[device.identity] = device
            labels = device.labels()
            for column, (metric, fixed) in spelling.MONITOR_COLUMNS.items():
                read = leaf(row.get(column, "N/A"))
                if read is None:
                    out.drop("unsupported")
                    continue
                factor = spelling.UNITS.get(read[1], 1.0)
                out.add(SeriesKey(metric, {**labels, **fixed}), ts_ms, read[0] * factor)
            vram = row.get("VRAM_USAGE", "")
            if m := _VRAM.match(vram):
                out.add(
                    SeriesKey("gpu_memory_used_bytes", labels), ts_ms, float(m.group(1)) * 2**30
                )
                out.add(
                    SeriesKey("gpu_memory_total_bytes", labels), ts_ms, float(m.group(2)) * 2**30
                )
        return out


class AmdSmiCollector:
    """Runs ``amd-smi metric --json`` on this host each collection."""

    kind = "amdsmi"

    def __init__(
        self,
        static_labels: Mapping[str, str] | None = None,
        *,
        host: str = "",
        runner: Runner = run_command,
    ) -> None:
        self._runner = runner
        self._translator = AmdSmiTranslator(static_labels, host=host)

    def collect(self, ts_ms: int) -> Collected:
        text = self._runner(["amd-smi", "metric", "--json"])
        try:
            gpus = gpus_from_json(text)
        except ValueError as exc:
            out = Collected()
            out.drop("malformed", why=f"amd-smi metric --json: {exc}")
            return out
        return self._translator.translate(gpus, ts_ms)


def _sequence(out: Collected, value: Any) -> list[Any] | tuple[Any, ...]:
    """A per-stack or per-link reading; anything else (``"N/A"``) is counted, not iterated."""
    if value is None or isinstance(value, list | tuple):
        return value or ()
    out.drop("unsupported")
    return ()


def import_amdsmi() -> Any:
    """The ``amdsmi`` module, or SourceUnavailable saying why it cannot be used here."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except (ImportError, KeyError, OSError) as exc:  # KeyError: the wheel without ROCm
        raise SourceUnavailable(
            f"the amdsmi library cannot be used here ({type(exc).__name__}: {exc}); install ROCm"
        ) from None
    return amdsmi


class AmdSmiLibraryCollector:
    """Reads ``amdsmi_get_gpu_metrics_info`` through the library (module passed in)."""

    kind = "amdsmi-library"

    def __init__(
        self, amdsmi: Any, static_labels: Mapping[str, str] | None = None, *, host: str = ""
    ) -> None:
        self._lib = amdsmi
        self.static = dict(static_labels or {})
        self.host = self.static.get("host") or host
        self._handles: list[Any] = []
        self._ticks = TickPeriod()
        self._no_bad_pages: set[str] = set()

    def open(self) -> None:
        self._lib.amdsmi_init()
        self._handles = list(self._lib.amdsmi_get_processor_handles())

    def close(self) -> None:
        self._lib.amdsmi_shut_down()

    def collect(self, ts_ms: int) -> Collected:
        out = Collected()
        for index, handle in enumerate(self._handles):
            device = device_for(self.static, host=self.host, gpu=str(index), vendor="amd")
            out.devices[device.identity] = device
            labels = device.labels()
            read_bad_pages(self._lib, handle, labels, out, ts_ms, self._no_bad_pages)
            try:
                m = self._lib.amdsmi_get_gpu_metrics_info(handle)
            except Exception as exc:
                out.drop("unsupported", why=f"gpu {index}: {exc}")
                continue
            for key, (metric, fixed, factor) in spelling.LIBRARY_METRICS.items():
                value = m.get(key)
                if isinstance(value, int | float):
                    out.add(SeriesKey(metric, {**labels, **fixed}), ts_ms, value * factor)
                else:
                    out.drop("unsupported")
            for stack, value in enumerate(_sequence(out, m.get("temperature_hbm"))):
                if isinstance(value, int | float):
                    out.add(
                        SeriesKey(
                            "gpu_hbm_stack_temperature_celsius", {**labels, "stack": str(stack)}
                        ),
                        ts_ms,
                        value,
                    )
            counter = m.get("accumulation_counter")
            period = (
                self._ticks.observe(device.identity, ts_ms, counter)
                if isinstance(counter, int | float)
                else TickPeriod.DEFAULT
            )
            for key, reason in spelling.LIBRARY_VIOLATIONS.items():
                value = m.get(key)
                if isinstance(value, int | float):
                    out.add(
                        SeriesKey("gpu_throttle_seconds_total", {**labels, "reason": reason}),
                        ts_ms,
                        value * period,
                    )
            for direction, key in (("rx", "xgmi_read_data_acc"), ("tx", "xgmi_write_data_acc")):
                for link, value in enumerate(_sequence(out, m.get(key))):
                    if isinstance(value, int | float):
                        out.add(
                            SeriesKey(
                                "gpu_fabric_bytes_total",
                                {
                                    **labels,
                                    "fabric": "xgmi",
                                    "link": str(link),
                                    "direction": direction,
                                },
                            ),
                            ts_ms,
                            value * 1024.0,
                        )
        return out


__all__ = [
    "AmdSmiCollector",
    "AmdSmiLibraryCollector",
    "AmdSmiTranslator",
    "SourceUnavailable",
    "gpus_from_json",
    "gpus_from_monitor",
    "gpus_from_text",
    "import_amdsmi",
]
