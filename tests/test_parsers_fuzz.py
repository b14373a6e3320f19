"""Hypothesis against the parsers of vendor commands and libraries (issue 12 point 5).

amd-smi (JSON, text, ``monitor``), nvidia-smi (CSV, ``-q -x`` XML), NVML and the amdsmi
library, with the shapes they really print and hostile values in them: each reading is a
sample or a counted drop, never an exception.  Strategies and settings: tests/test_fuzz.py.
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from xml.sax.saxutils import escape

from hypothesis import given
from hypothesis import strategies as st

from hbmwatch.collector.sources.amdsmi import (
    AmdSmiLibraryCollector,
    AmdSmiTranslator,
    gpus_from_json,
    gpus_from_monitor,
    gpus_from_text,
)
from hbmwatch.collector.sources.nvidia_smi import NvidiaSmiTranslator, parse_csv
from hbmwatch.collector.sources.nvml import NvmlCollector
from hbmwatch.collector.spellings import amdsmi as spelling_amdsmi
from hbmwatch.collector.spellings import nvidia_smi as spelling_nvsmi
from tests.fakes.nvml import FakeNvml
from tests.test_fuzz import FUZZ, assert_clean, hostile_text, json_tree, values


@FUZZ
@given(json_tree)
def test_amdsmi_json_never_raises_past_value_error(tree: object) -> None:
    try:
        gpus = gpus_from_json(json.dumps(tree))
    except ValueError:
        return
    assert_clean(AmdSmiTranslator(host="h").translate(gpus, 0))


@FUZZ
@given(st.text(max_size=300))
def test_amdsmi_text_and_monitor_never_raise(text: str) -> None:
    t = AmdSmiTranslator(host="h")
    assert_clean(t.translate(gpus_from_text(text), 0))
    assert_clean(t.translate_monitor(gpus_from_monitor(text), 0))


cells = st.one_of(
    st.sampled_from(
        ["N/A", "1..2/ 3 GB", "1.5/ 192.0 GB", "./. GB", "1e999 W", "٣ W", "-1 °C", "0", "x"]
    ),
    values.map(str),
    hostile_text.filter(lambda t: t.strip() and " " not in t),
)


@FUZZ
@given(st.lists(st.lists(cells, min_size=1, max_size=12), max_size=4))
def test_amdsmi_monitor_tables_never_raise(rows: list[list[str]]) -> None:
    """``amd-smi monitor`` shaped tables: the header the parser knows, hostile cells."""
    header = ["GPU", "XCP", *spelling_amdsmi.MONITOR_COLUMNS, "VRAM_USAGE"]
    lines = ["  ".join(header)]
    for row in rows:
        full = (["0", "0"] + row + ["0"] * len(header))[: len(header) - 1]
        lines.append("  ".join([*full, row[-1]]))
    gpus = gpus_from_monitor("\n".join(lines))
    assert_clean(AmdSmiTranslator(host="h").translate_monitor(gpus, 0))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["gpu", "temperature", "hotspot", "power",
                                           "socket_power", "throttle", "ppt_accumulated",
                                           "accumulation_counter", "mem"]),
                          st.integers(0, 3), cells), max_size=12))  # fmt: skip
def test_amdsmi_text_trees_never_raise(lines: list[tuple[str, int, str]]) -> None:
    """``amd-smi metric`` text shaped: ``GPU: <hostile>`` and indented ``KEY: VALUE`` lines."""
    text = "\n".join(f"{'    ' * depth}{key.upper()}: {cell}" for key, depth, cell in lines)
    t = AmdSmiTranslator(host="h")
    for ts in (0, 10_000):
        assert_clean(t.translate(gpus_from_text(text), ts))


@FUZZ
@given(st.text(max_size=300))
def test_nvidia_smi_never_raises_past_value_error(text: str) -> None:
    t = NvidiaSmiTranslator(host="h")
    with contextlib.suppress(ValueError):  # parse_csv refuses what is not CSV at all
        rows = parse_csv(text)
        assert_clean(t.translate_csv(rows, 0))
    out = t.translate_xml(text, 0)
    assert out.dropped["malformed"] <= 1


@FUZZ
@given(st.lists(st.lists(cells, min_size=1, max_size=30), min_size=1, max_size=3))
def test_nvidia_smi_csv_tables_never_raise(rows: list[list[str]]) -> None:
    """``--query-gpu`` CSV with the real header: any cell is counted, never raised."""
    fields = ["index", *spelling_nvsmi.QUERY_FIELDS, *spelling_nvsmi.BITMASK_FIELDS]
    header = ", ".join(f"{f} [W]" if "power" in f else f for f in fields)
    body = ["0, " + ", ".join(c.replace(",", "") for c in row) for row in rows]
    body += ["1" + ", x" * (len(fields) - 2) + ", 0xZZ"]
    try:
        rows_read = parse_csv("\n".join([header, *body]))
    except ValueError:  # not CSV at all (a raw CR): the collector counts one malformed read
        return
    assert_clean(NvidiaSmiTranslator(host="h").translate_csv(rows_read, 0))


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(spelling_nvsmi.XML_PATHS)), hostile_text,
                       max_size=6), hostile_text)  # fmt: skip
def test_nvidia_smi_xml_documents_never_raise(leaves: dict[str, str], minor: str) -> None:
    """``-q -x`` documents with hostile element text, lone surrogates included."""

    def element(path: str, text: str) -> str:
        head, _, rest = path.partition("/")
        inner = element(rest, text) if rest else escape(text)
        return f"<{head}>{inner}</{head}>"

    gpu = "".join(element(p, t) for p, t in leaves.items())
    doc = f"<nvidia_smi_log><gpu><minor_number>{escape(minor)}</minor_number>{gpu}</gpu>"
    out = NvidiaSmiTranslator(host="h").translate_xml(doc + "</nvidia_smi_log>", 0)
    assert_clean(out)
    assert out.dropped["malformed"] <= 1


class HostileNvml(FakeNvml):
    """FakeNvml whose field values and clocks-event bitmask are drawn by hypothesis."""

    def __init__(self, fields: list[float | int], bits: int) -> None:
        super().__init__()
        self.hostile, self.bits = fields, bits

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.bits

    def nvmlDeviceGetFieldValues(self, h: int, ids: list) -> list:
        out = super().nvmlDeviceGetFieldValues(h, ids)
        for value, hostile in zip(out, self.hostile, strict=False):
            value.nvmlReturn, value.valueType, value.value = 0, 0, SimpleNamespace(dVal=hostile)
        return out


@FUZZ
@given(st.lists(st.one_of(st.floats(), st.integers(0, 2**64 - 1)), max_size=12),
       st.integers(0, 2**64 - 1))  # fmt: skip
def test_nvml_readings_never_raise(fields: list[float | int], bits: int) -> None:
    source = NvmlCollector(HostileNvml(fields, bits), host="h")
    source.open()
    assert_clean(source.collect(0))


library_values = st.one_of(
    st.floats(), st.integers(0, 2**64 - 1), st.just("N/A"), st.lists(st.floats(), max_size=4)
)


@FUZZ
@given(st.dictionaries(st.sampled_from([*spelling_amdsmi.LIBRARY_METRICS,
                                        *spelling_amdsmi.LIBRARY_VIOLATIONS,
                                        "accumulation_counter", "temperature_hbm",
                                        "xgmi_read_data_acc"]),
                       library_values, max_size=8), st.integers(1, 3))  # fmt: skip
def test_amdsmi_library_never_raises(metrics: dict[str, object], reads: int) -> None:
    class Lib:
        def amdsmi_init(self) -> None: ...
        def amdsmi_get_processor_handles(self) -> list[int]:
            return [0]

        def amdsmi_get_gpu_metrics_info(self, handle: int) -> dict:
            return metrics

    source = AmdSmiLibraryCollector(Lib(), host="h")
    source.open()
    for i in range(reads):
        assert_clean(source.collect(10_000 * i))
