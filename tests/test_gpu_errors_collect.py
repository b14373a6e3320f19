"""GPU errors, row remapping, retired pages and health verdicts, from real exporter pages.

dcgm-exporter's XID field and DME's AFID lines show only the last event; the collector turns
them into ``gpu_error_events_total{scheme, code}`` counters (collector/sources/gpu_events.py).
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

import pytest

from hbmwatch.collector.sources.amdsmi import AmdSmiLibraryCollector
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.nvml import NvmlCollector
from hbmwatch.collector.translate import Collected
from hbmwatch.gpu_errors import CODES, Action, lookup, render_markdown
from hbmwatch.metrics import ERROR_SCHEMES
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample
from hbmwatch.store.registry import validate_series
from hbmwatch.store.store import Store
from tests.conftest import NOW, REPO
from tests.fakes.nvml import FakeNvml, nvmlEventTypeXidCriticalError

T = int(NOW * 1000) - 600_000
LKE = "upstream/linode-lke-ai-conformance/dcgm-exporter-k8s-page.prom"
DME = "upstream/amd-device-metrics-exporter"
XID_LINE = re.compile(r"^DCGM_FI_DEV_XID_ERRORS\{.*$", re.M)
#: The mandatory labels a current DME build puts on every GPU line (spellings/dme.py).
DME_LABELS = (
    'card_model="MI300X",gpu_compute_partition_type="spx",gpu_memory_partition_type="nps1",'
    'gpu_partition_id="0",hostname="node-a",serial_number="692247001282"'
)


def events(out: Collected, scheme: str = "xid") -> dict[tuple[str, str], list[float]]:
    """(gpu, code) -> the counter's values on this page, in order."""
    found: dict[tuple[str, str], list[float]] = {}
    for s in out.samples:
        if s.series.metric == "gpu_error_events_total" and s.series.label("scheme") == scheme:
            found.setdefault((s.series.label("gpu"), s.series.label("code")), []).append(s.value)
    return found


def values(out: Collected, metric: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in out.samples
        if s.series.metric == metric and all(s.series.label(k) == v for k, v in labels.items())
    ]


def canonical(out: Collected) -> None:
    for s in out.samples:
        validate_series(s.series)


def lke_page(fixtures_dir: Path, xid: int | str, *, err_labels: bool = True) -> str:
    """The real page with its XID line showing ``xid`` (the exporter's own label layout)."""
    text = (fixtures_dir / LKE).read_text()
    line = XID_LINE.search(text)
    assert line is not None
    head, _, _ = line.group(0).rpartition(" ")
    labels = f'err_code="{xid}",err_msg="XID {xid}",' if err_labels else ""
    head = head.replace('err_code="0",err_msg="No Error",', labels)  # none: older builds
    return text.replace(line.group(0), f"{head} {xid}")


# -- dcgm-exporter ----------------------------------------------------------------------------
def test_dcgm_real_k8s_page_row_remaps_and_no_xid(fixtures_dir: Path) -> None:
    out = DcgmTranslator().translate_text((fixtures_dir / LKE).read_text(), T)
    canonical(out)
    assert values(out, "gpu_row_remaps_total", severity="correctable") == [0.0]
    assert values(out, "gpu_row_remaps_total", severity="uncorrectable") == [0.0]
    assert values(out, "gpu_row_remap_failed") == [0.0]
    assert events(out) == {}  # XID 0: no event yet, no counter
    assert not out.dropped  # the XID line is read, not dropped as ignored or unmapped
    (device,) = out.devices.values()
    assert device.host == "lke529760-766837-0a634ab30000"
    device_series = [s for s in out.samples if s.series.metric != "gpu_workload_info"]
    assert all("pod" not in s.series.label_dict for s in device_series)


@pytest.mark.parametrize("err_labels", [True, False], ids=["err_code", "plain"])
def test_dcgm_xid_changes_count_one_event_each(fixtures_dir: Path, err_labels: bool) -> None:
    """0, 79, 79, 0, 79, 13: three events; the same value twice counts nothing new.  Without
    ``err_code`` labels the page keeps its shape, so the translator's fast path runs too."""
    t = DcgmTranslator()
    seen = []
    for i, xid in enumerate([0, 0, 79, 79, 0, 79, 13, 13]):
        out = t.translate_text(lke_page(fixtures_dir, xid, err_labels=err_labels), T + i * 1000)
        canonical(out)
        seen.append(events(out))
    shape = t._shape  # the last page's shape: XID lines are special lines of it
    assert shape is not None and shape.usable and shape.special
    assert seen[1] == {}
    assert seen[2] == {("0", "79"): [0.0, 1.0]}  # a new counter starts at 0, just before
    assert seen[3] == {("0", "79"): [1.0]}
    assert seen[4] == {("0", "79"): [1.0]}
    assert seen[5] == {("0", "79"): [2.0]}
    assert seen[6] == {("0", "79"): [2.0], ("0", "13"): [0.0, 1.0]}
    assert seen[7] == {("0", "79"): [2.0], ("0", "13"): [1.0]}


def test_dcgm_first_page_with_an_xid_counts_it_once(fixtures_dir: Path) -> None:
    t = DcgmTranslator()
    first = t.translate_text(lke_page(fixtures_dir, 48), T)
    again = t.translate_text(lke_page(fixtures_dir, 48), T + 1000)
    assert events(first) == {("0", "48"): [0.0, 1.0]}
    assert events(again) == {("0", "48"): [1.0]}
    zero, one = [s for s in first.samples if s.series.metric == "gpu_error_events_total"]
    assert (zero.timestamp_ms, one.timestamp_ms) == (T - 1, T)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("NaN", "non_finite"),
        ("+Inf", "non_finite"),
        ("9223372036854775794", "sentinel"),  # DCGM's not-supported marker
        ("-3", "malformed"),
        ("7.5", "malformed"),
        ("garbage", "malformed"),
    ],
)
def test_dcgm_bad_xid_values_are_dropped_and_counted(
    fixtures_dir: Path, value: str, reason: str
) -> None:
    t = DcgmTranslator()
    t.translate_text(lke_page(fixtures_dir, 0), T)
    out = t.translate_text(lke_page(fixtures_dir, value), T + 1000)
    assert out.dropped[reason] == 1
    assert events(out) == {}
    later = t.translate_text(lke_page(fixtures_dir, 0), T + 2000)
    assert events(later) == {}  # the bad value was no event, and 0 after it is none either


DCGM_LABELS = 'gpu="0",UUID="GPU-a",Hostname="node-a",modelName="NVIDIA H200"'


def test_dcgm_xid_count_collector_is_preferred_to_the_last_xid() -> None:
    """``DCGM_EXP_XID_ERRORS_COUNT`` counts within a window: each rise is new events; a fall
    (events leaving the window) is none.  With it present the last-XID gauge is not counted."""
    t = DcgmTranslator()

    def page(count: int) -> str:
        return (
            f"DCGM_FI_DEV_XID_ERRORS{{{DCGM_LABELS}}} 79\n"
            f'DCGM_EXP_XID_ERRORS_COUNT{{{DCGM_LABELS},window_size_in_ms="300000",xid="79"}} '
            f"{count}\n"
        )

    totals = [events(t.translate_text(page(n), T + i * 1000)) for i, n in enumerate([2, 2, 3, 0])]
    assert totals[0] == {("0", "79"): [0.0, 2.0]}
    assert totals[1] == {("0", "79"): [2.0]}
    assert totals[2] == {("0", "79"): [3.0]}
    assert totals[3] == {("0", "79"): [3.0]}


def test_dcgm_health_watches_become_health_status() -> None:
    lines = [
        ('health_watch="ALL",health_error_code="DCGM_FR_XID_ERROR"', 20),
        ('health_watch="PCIE",health_error_code="DCGM_FR_OK"', 0),
        ('health_watch="MEM",health_error_code="DCGM_FR_VOLATILE_DBE_DETECTED"', 20),
        ('health_watch="THERMAL",health_error_code="DCGM_FR_CLOCK_THROTTLE_THERMAL"', 10),
        ('health_watch="NVSWITCH_NONFATAL",health_error_code="DCGM_FR_OK"', 0),
        ('health_watch="NVSWITCH_FATAL",health_error_code="DCGM_FR_NVSWITCH_FATAL_ERROR"', 20),
        ('health_watch="CONNECTX",health_error_code="DCGM_FR_OK"', 0),
        ('health_watch="POWER",health_error_code="DCGM_FR_OK"', 5),
    ]
    text = "".join(
        f"DCGM_EXP_GPU_HEALTH_STATUS{{{DCGM_LABELS},{extra}}} {v}\n" for extra, v in lines
    )
    out = DcgmTranslator().translate_text(text, T)
    canonical(out)
    status = {s.series.label("check"): s.value for s in out.samples}
    assert status == {"overall": 2.0, "pcie": 0.0, "memory": 2.0, "thermal": 1.0, "nvswitch": 2.0}
    assert out.dropped == {"unmapped": 1, "malformed": 1}  # CONNECTX; 5 is no DCGM result


def test_dcgm_odd_error_lines_are_dropped_not_crashed_on() -> None:
    """An XID count without a number, a health line without a watch (read as overall), an
    XID line without a GPU."""
    text = (
        f'DCGM_EXP_XID_ERRORS_COUNT{{{DCGM_LABELS},xid="abc"}} 1\n'
        f"DCGM_EXP_GPU_HEALTH_STATUS{{{DCGM_LABELS}}} 10\n"
        'DCGM_FI_DEV_XID_ERRORS{Hostname="node-a"} 79\n'
        f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{DCGM_LABELS}}} 9223372036854775794\n"
    )
    out = DcgmTranslator().translate_text(text, T)
    assert values(out, "gpu_health_status", check="overall") == [1.0]
    assert dict(out.dropped) == {"malformed": 1, "no_device": 1, "sentinel": 1}
    assert events(out) == {}


# -- AMD Device Metrics Exporter --------------------------------------------------------------
def dme_page(fixtures_dir: Path, name: str) -> str:
    """An upstream excerpt with its ``...`` filled with the mandatory labels."""
    text = (fixtures_dir / DME / name).read_text()
    text = text.replace(", ...}", f",{DME_LABELS}}}").replace(" ... ", f"{DME_LABELS},")
    return text.replace(", ", ",")


def test_dme_docs_afid_event_counts_each_afid_once(fixtures_dir: Path) -> None:
    t = DmeTranslator()
    page = dme_page(fixtures_dir, "metricslist-afid-example.prom")
    first = t.translate_text(page, T)
    canonical(first)
    assert events(first, "afid") == {("0", "30"): [0.0, 1.0], ("0", "25"): [0.0, 1.0]}
    same = t.translate_text(page, T + 1000)
    assert events(same, "afid") == {("0", "30"): [1.0], ("0", "25"): [1.0]}
    changed = page.replace("} 25", "} 55")  # the next RAS event: AFIDs 30 and 55
    third = t.translate_text(changed, T + 2000)
    assert events(third, "afid") == {
        ("0", "30"): [2.0],
        ("0", "25"): [1.0],
        ("0", "55"): [0.0, 1.0],
    }
    assert lookup("afid", 30).action is Action.UNKNOWN  # counted, with no sourced meaning


def test_dme_mock_ras_afids_on_two_gpus(fixtures_dir: Path) -> None:
    page = dme_page(fixtures_dir, "internal-readme-afid-mock.prom").replace(
        'serial_number="692247001282",', ""
    )  # two GPUs told apart by gpu_uuid alone
    out = DmeTranslator().translate_text(page, T)
    canonical(out)
    assert events(out, "afid") == {("0", "55"): [0.0, 1.0], ("1", "65"): [0.0, 1.0]}


@pytest.mark.parametrize(
    ("value", "status", "dropped"),
    [
        ("1", 0.0, {}),
        ("0", 2.0, {}),
        ("0.5", None, {"malformed": 1}),
        ("NaN", None, {"non_finite": 1}),
    ],
)
def test_dme_gpu_health_is_the_overall_verdict(
    value: str, status: float | None, dropped: dict[str, int]
) -> None:
    page = f'amd_gpu_health{{gpu_id="0",{DME_LABELS}}} {value}\n'
    out = DmeTranslator().translate_text(page, T)
    canonical(out)
    expected = [] if status is None else [status]
    assert values(out, "gpu_health_status", check="overall") == expected
    assert dict(out.dropped) == dropped


# -- NVML in-process ----------------------------------------------------------------------------
def test_nvml_xid_events_row_remaps_and_no_retired_pages_on_hopper() -> None:
    nvml = FakeNvml(devices=2)
    source = NvmlCollector(nvml, {"cluster": "c"}, host="h200")
    source.open()
    assert nvml.registered == {0: nvmlEventTypeXidCriticalError, 1: nvmlEventTypeXidCriticalError}
    first = source.collect(T)
    canonical(first)
    assert values(first, "gpu_row_remaps_total", gpu="0", severity="uncorrectable") == [0.0]
    assert values(first, "gpu_row_remap_pending", gpu="1") == [0.0]
    assert values(first, "gpu_retired_pages") == []  # NOT_SUPPORTED on Hopper: skipped
    assert "retired_pages_correctable" in source.unsupported["0"]
    assert events(first) == {}
    nvml.raise_xid(1, 79)
    nvml.raise_xid(1, 79)
    nvml.raise_xid(0, 13)
    nvml.remapped = (0, 1, 1, 0)
    second = source.collect(T + 1000)
    canonical(second)
    assert events(second) == {("1", "79"): [0.0, 2.0], ("0", "13"): [0.0, 1.0]}
    assert values(second, "gpu_row_remap_pending", gpu="0") == [1.0]
    assert values(second, "gpu_row_remaps_total", gpu="0", severity="uncorrectable") == [1.0]
    third = source.collect(T + 2000)
    assert events(third) == {("1", "79"): [2.0], ("0", "13"): [1.0]}  # nothing new waiting
    source.close()
    assert nvml.event_sets == 0


def test_nvml_bad_event_is_dropped_and_counted() -> None:
    nvml = FakeNvml()
    source = NvmlCollector(nvml, host="h200")
    source.open()
    nvml.raise_xid(0, 0)  # no XID number
    nvml.raise_xid(7, 79)  # not registered: never arrives
    nvml.waiting.append(type(nvml.waiting[0])(device=5, eventType=8, eventData=31))
    out = source.collect(T)
    assert out.dropped["malformed"] == 2 and events(out) == {}
    source.close()


# -- amdsmi library ------------------------------------------------------------------------------
class AmdSmiMemoryPageStatus(IntEnum):
    """As the amdsmi Python package names the statuses of a bad page."""

    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class BadPagesLib:
    """The ``amdsmi`` calls the library collector makes, with three GPUs' bad-page answers:
    two retired pages and one pending; the older library's "none" string; an error."""

    calls = 0

    def amdsmi_init(self) -> None: ...
    def amdsmi_shut_down(self) -> None: ...
    def amdsmi_get_processor_handles(self) -> list[int]:
        return [0, 1, 2]

    def amdsmi_get_gpu_metrics_info(self, handle: int) -> dict:
        return {"temperature_mem": 61}

    def amdsmi_get_gpu_bad_page_info(self, handle: int) -> list[dict] | str:
        self.calls += 1
        if handle == 2:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        if handle == 1:
            return "No bad pages found."
        status = AmdSmiMemoryPageStatus
        return [
            {"value": i, "page_address": 0x1000 * i, "page_size": 4096, "status": s}
            for i, s in enumerate([status.RESERVED, status.UNRESERVABLE, status.PENDING])
        ]


def test_amdsmi_bad_pages_become_retired_pages() -> None:
    lib = BadPagesLib()
    source = AmdSmiLibraryCollector(lib, host="mi300x")
    source.open()
    first = source.collect(T)
    canonical(first)
    assert values(first, "gpu_retired_pages", gpu="0", severity="uncorrectable") == [2.0]
    assert values(first, "gpu_retired_pages_pending", gpu="0") == [1.0]
    assert values(first, "gpu_retired_pages", gpu="1") == [0.0]
    assert values(first, "gpu_retired_pages_pending", gpu="1") == [0.0]
    assert values(first, "gpu_retired_pages", gpu="2") == []
    assert first.dropped["unsupported"] >= 1
    source.collect(T + 1000)
    assert lib.calls == 5  # the GPU that refused is not asked again


# -- through the store --------------------------------------------------------------------------
def test_event_counters_are_stored_with_their_first_zero(store: Store, fixtures_dir: Path) -> None:
    t = DcgmTranslator()
    samples: list[Sample] = []
    for i, xid in enumerate([0, 79, 79, 13]):
        samples += t.translate_text(lke_page(fixtures_dir, xid), T + i * 1000).samples
    result = store.write(samples)
    assert result.accepted == len(samples) and not result.rejected
    got = store.range_query(
        parse_selector('gpu_error_events_total{code="79"}'),
        T / 1000 - 1,
        T / 1000 + 4,
        1,
        Aggregation.MAX,
        None,
    )
    (series,) = got.series
    assert [(p.timestamp - T / 1000, p.value) for p in series.points] == [
        (0.0, 0.0),
        (1.0, 1.0),
        (2.0, 1.0),
        (3.0, 1.0),
    ]  # the 0 at 0.999 s, then the first event


# -- the code table -----------------------------------------------------------------------------
def test_code_table_is_sane() -> None:
    assert {scheme for scheme, _ in CODES} <= set(ERROR_SCHEMES)
    for (scheme, code), entry in CODES.items():
        assert (entry.scheme, entry.code) == (scheme, code)
        assert entry.meaning and entry.source and entry.action is not Action.UNKNOWN
    for xid in (13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95):
        assert ("xid", xid) in CODES
    for xid in (109, 119, 120, 121, 140, 143, 154):
        assert ("xid", xid) in CODES
    assert lookup("xid", "79").action is Action.FATAL
    assert lookup("xid", 64).action is Action.FATAL
    assert lookup("xid", 13).action is Action.BENIGN
    assert lookup("xid", 4242).action is Action.UNKNOWN


def test_docs_gpu_errors_md_is_generated_from_the_table() -> None:
    checked_in = (REPO / "docs" / "gpu-errors.md").read_text()
    assert checked_in == render_markdown(), "run: hbmwatch docs gpu-errors"
