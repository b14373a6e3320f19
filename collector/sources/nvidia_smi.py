"""nvidia-smi as a source, for hosts with neither dcgm-exporter nor the NVML bindings.

Reads ``nvidia-smi --query-gpu=... --format=csv`` (with or without units) and ``nvidia-smi
-q -x``.  ``[N/A]``, ``N/A`` and ``[Requested functionality has been deprecated]`` are
unsupported values: dropped and counted.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from hbmwatch.collector.sources.amdsmi import Runner, SourceUnavailable, run_command
from hbmwatch.collector.spellings import dcgm as dcgm_spelling
from hbmwatch.collector.spellings import nvidia_smi as spelling
from hbmwatch.collector.translate import Collected, device_for
from hbmwatch.records import SeriesKey

_NUMBER_UNIT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]*)\s*$")
QUERY = ",".join(
    [
        "index",
        "uuid",
        "serial",
        "name",
        "driver_version",
        *spelling.QUERY_FIELDS,
        spelling.BITMASK_FIELDS[0],
    ]
)


def number(text: str, unit_hint: str = "") -> float | None:
    """A value with its unit applied: ``'102.99 W'`` -> 102.99, ``'1980 MHz'`` -> 1.98e9.

    >>> number("102.99 W"), number("16x"), number("[N/A]"), number("35", "C")
    (102.99, 16.0, None, 35.0)
    """
    m = _NUMBER_UNIT.match(text)
    if not m:
        return None
    unit = m.group(2) or unit_hint
    factor = spelling.UNITS.get(unit)
    return None if factor is None else float(m.group(1)) * factor


def parse_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """Rows of a ``--format=csv`` answer: field -> (value, unit from the header)."""
    reader = csv.reader(io.StringIO(text.strip().replace("\0", "")), skipinitialspace=True)
    try:
        rows = [row for row in reader if row]
    except csv.Error as exc:
        raise ValueError(f"not nvidia-smi CSV: {exc}") from None
    if not rows:
        return []
    header = []
    for cell in rows[0]:
        name, _, unit = cell.strip().partition(" [")
        header.append((name.strip(), unit.rstrip("]")))
    return [
        {name: (value.strip(), unit) for (name, unit), value in zip(header, row, strict=False)}
        for row in rows[1:]
    ]


class NvidiaSmiTranslator:
    def __init__(self, static_labels: Mapping[str, str] | None = None, *, host: str = "") -> None:
        self.static = dict(static_labels or {})
        self.host = self.static.get("host") or host

    def translate_csv(self, rows: list[dict[str, tuple[str, str]]], ts_ms: int) -> Collected:
        out = Collected()
        for position, row in enumerate(rows):
            ident = {
                spelling.IDENTITY_FIELDS[k]: v[0]
                for k, v in row.items()
                if k in spelling.IDENTITY_FIELDS
            }
            device = device_for(
                self.static,
                host=ident.get("host", self.host),
                gpu=ident.get("gpu", str(position)),
                vendor="nvidia",
                model=ident.get("model", ""),
                uuid=ident.get("uuid", "").removeprefix("GPU-"),
                serial=ident.get("serial", ""),
                driver=ident.get("driver", ""),
            )
            if not device.host:
                out.drop("no_device")
                continue
            out.devices[device.identity] = device
            labels = device.labels()
            values: dict[SeriesKey, float] = {}
            for field, (metric, fixed) in spelling.QUERY_FIELDS.items():
                if field not in row:
                    continue
                value = number(*row[field])
                if value is None:
                    out.drop("unsupported")
                    continue
                key = SeriesKey(metric, {**labels, **fixed})
                if key not in values or field in spelling.PREFERRED:
                    values[key] = value
            for key, value in values.items():
                out.add(key, ts_ms, value)
            for field in spelling.BITMASK_FIELDS:
                if field in row and row[field][0].startswith("0x"):
                    self._bitmask(out, labels, row[field][0], ts_ms)
        return out

    @staticmethod
    def _bitmask(out: Collected, labels: dict[str, str], text: str, ts_ms: int) -> None:
        """One active flag per throttle reason; a mask that is not hex is counted, not fatal."""
        try:
            bits = int(text, 16)
        except ValueError:
            out.drop("malformed", why=f"clocks_event_reasons bitmask {text[:40]!r}")
            return
        for bit, reason in dcgm_spelling.THROTTLE_BITS.items():
            out.add(
                SeriesKey("gpu_throttle_active", {**labels, "reason": reason}),
                ts_ms,
                1.0 if bits & bit else 0.0,
            )

    def translate_xml(self, text: str, ts_ms: int) -> Collected:
        out = Collected()
        try:
            root = ET.fromstring(text)
        except (ET.ParseError, ValueError) as exc:  # ValueError: lone surrogates in the text
            out.drop("malformed", why=f"nvidia-smi -q -x: {exc}")
            return out
        driver = root.findtext("driver_version", "")
        for position, gpu in enumerate(root.findall("gpu")):
            device = device_for(
                self.static,
                host=self.host,
                gpu=gpu.findtext("minor_number") or str(position),
                vendor="nvidia",
                model=gpu.findtext("product_name", ""),
                uuid=gpu.findtext("uuid", "").removeprefix("GPU-"),
                serial=gpu.findtext("serial", ""),
                driver=driver,
            )
            if not device.host:
                out.drop("no_device")
                continue
            out.devices[device.identity] = device
            labels = device.labels()
            for path, (metric, fixed) in spelling.XML_PATHS.items():
                text_value = gpu.findtext(path)
                if text_value is None:
                    continue
                value = number(text_value)
                if value is None:
                    out.drop("unsupported")
                    continue
                out.add(SeriesKey(metric, {**labels, **fixed}), ts_ms, value)
            for vendor, reason in spelling.XML_REASONS.items():
                state = gpu.findtext(f"clocks_event_reasons/clocks_event_reason_{vendor}")
                if state in ("Active", "Not Active"):
                    out.add(
                        SeriesKey("gpu_throttle_active", {**labels, "reason": reason}),
                        ts_ms,
                        1.0 if state == "Active" else 0.0,
                    )
        return out


class NvidiaSmiCollector:
    kind = "nvidia-smi"

    def __init__(
        self,
        static_labels: Mapping[str, str] | None = None,
        *,
        host: str = "",
        runner: Runner = run_command,
    ) -> None:
        self._runner = runner
        self._translator = NvidiaSmiTranslator(static_labels, host=host)

    def collect(self, ts_ms: int) -> Collected:
        text = self._runner(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"])
        try:
            rows = parse_csv(text)
        except ValueError as exc:
            out = Collected()
            out.drop("malformed", why=str(exc))
            return out
        return self._translator.translate_csv(rows, ts_ms)


__all__ = ["NvidiaSmiCollector", "NvidiaSmiTranslator", "SourceUnavailable", "parse_csv"]
