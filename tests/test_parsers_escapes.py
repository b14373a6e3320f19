"""Issue 12 points 5 and 6: each hostile value the fuzzer found is a counted drop, not a crash.

One test per named escape (DCGM bitmask NaN and Inf, DME TickPeriod on +Inf, amd-smi
monitor ValueError, nvidia-smi XML with lone surrogates, a Latin-1 byte in the targets
file), the others found on the way, and one scrape of a hostile page over real HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import structlog

from hbmwatch.collector.sources.amdsmi import (
    AmdSmiLibraryCollector,
    AmdSmiTranslator,
    gpus_from_json,
    gpus_from_monitor,
    gpus_from_text,
)
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.sources.mapped import load_mapping
from hbmwatch.collector.sources.nvidia_smi import NvidiaSmiTranslator, parse_csv
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.collector.translate import Collected, TickPeriod
from hbmwatch.settings import CollectorSettings
from hbmwatch.validation import ConfigError
from tests.conftest import Clock, make_store
from tests.test_collector import PageServer, engine_for
from tests.test_service import HBMWATCH, clean_env

T = 1_800_000_000_000
DCGM_TEMP = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 41\n'


def metrics(out: Collected) -> set[str]:
    return {s.series.metric for s in out.samples}


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e400"])
def test_dcgm_bitmask_nan_or_inf_is_a_dropped_sample(value: str) -> None:
    page = DCGM_TEMP + f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="0",Hostname="n1"}} {value}\n'
    out = DcgmTranslator().translate_text(page, T)
    assert out.dropped == {"non_finite": 1}
    assert metrics(out) == {"gpu_hotspot_temperature_celsius"}  # the rest of the page stays


@pytest.mark.parametrize("value", ["-4", "4.5"])
def test_dcgm_bitmask_negative_or_fractional_is_malformed(value: str) -> None:
    page = DCGM_TEMP + f'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{gpu="0",Hostname="n1"}} {value}\n'
    out = DcgmTranslator().translate_text(page, T)
    assert out.dropped == {"malformed": 1}
    assert "bitmask" in out.errors[0]


def dme_page(counter: str) -> str:
    labels = '{gpu_id="0",hostname="n1"}'
    return (
        f"gpu_violation_current_accumulated_counter{labels} {counter}\n"
        f"gpu_violation_ppt_residency_accumulated{labels} 500\n"
        f"gpu_edge_temperature{labels} 40\n"
    )


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-Inf"])
def test_dme_tick_counter_on_inf_is_dropped_and_keeps_the_page(value: str) -> None:
    translator = DmeTranslator({"cluster": "c"})
    translator.translate_text(dme_page("1000"), T)
    out = translator.translate_text(dme_page(value), T + 10_000)  # TickPeriod measures here
    assert out.dropped["non_finite"] == 1
    assert "gpu_throttle_seconds_total" in metrics(out)


def test_tick_period_never_overflows() -> None:
    ticks = TickPeriod()
    ticks.observe("gpu", 0, 0.0)
    assert ticks.observe("gpu", 10_000, 5e-324) == TickPeriod.DEFAULT  # 10 ** 324: no period
    assert ticks.observe("gpu", 20_000, 20_000.0) == 1e-3


def test_amdsmi_monitor_bad_vram_cell_is_skipped_not_raised() -> None:
    text = "GPU  POWER  GPU_T  VRAM_USAGE\n  0  100 W  40 °C  1..2/192.0 GB\n"
    out = AmdSmiTranslator(host="h").translate_monitor(gpus_from_monitor(text), T)
    assert "gpu_power_watts" in metrics(out)
    assert "gpu_memory_used_bytes" not in metrics(out)


def test_amdsmi_text_gpu_with_a_superscript_digit_is_no_device() -> None:
    out = AmdSmiTranslator(host="h").translate(gpus_from_text("GPU: ²\n  POWER:\n"), T)
    assert out.dropped == {"no_device": 1}


def test_amdsmi_json_integer_past_float_range_is_non_finite() -> None:
    doc = json.dumps([{"gpu": 0, "power": {"socket_power": {"value": 10**400, "unit": "W"}}}])
    out = AmdSmiTranslator(host="h").translate(gpus_from_json(doc), T)
    assert out.dropped == {"non_finite": 1}


def test_amdsmi_library_na_instead_of_a_list_is_counted() -> None:
    class Lib:
        def amdsmi_init(self) -> None: ...
        def amdsmi_get_processor_handles(self) -> list[int]:
            return [0]

        def amdsmi_get_gpu_metrics_info(self, handle: int) -> dict:
            return {"temperature_hbm": "N/A", "xgmi_read_data_acc": math.nan, "temperature_mem": 5}

    source = AmdSmiLibraryCollector(Lib(), host="h")
    source.open()
    out = source.collect(T)
    assert "gpu_memory_temperature_celsius" in metrics(out)
    assert out.dropped["unsupported"] >= 2


def test_nvidia_smi_xml_with_lone_surrogates_is_one_malformed_read() -> None:
    doc = "<nvidia_smi_log><gpu><product_name>H\ud800</product_name></gpu></nvidia_smi_log>"
    out = NvidiaSmiTranslator(host="h").translate_xml(doc, T)
    assert out.dropped == {"malformed": 1}
    assert "surrogates" in out.errors[0]


def test_nvidia_smi_csv_bitmask_that_is_not_hex_is_malformed() -> None:
    rows = parse_csv("index, temperature.gpu, clocks_event_reasons.active\n0, 40, 0xZZ\n")
    out = NvidiaSmiTranslator(host="h").translate_csv(rows, T)
    assert out.dropped == {"malformed": 1}
    assert metrics(out) == {"gpu_hotspot_temperature_celsius"}


def test_triton_summary_quantile_that_is_no_number_is_malformed() -> None:
    page = 'nv_inference_request_summary_us{model="m",quantile="x"} 5\n'
    out = InferenceTranslator({"service": "s"}).translate_text(page, T)
    assert out.dropped == {"malformed": 1}


# -- the targets file (point 6) ----------------------------------------------------------------
def test_latin1_byte_in_the_targets_file_keeps_the_last_targets(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    good = [{"kind": "dme", "url": "http://10.0.0.7:5000/metrics", "labels": {"host": "n7"}}]
    path.write_text(json.dumps(good))
    targets = TargetSet(CollectorSettings(target_file=str(path)))
    assert [t.url for t in targets.current()] == ["http://10.0.0.7:5000/metrics"]
    path.write_bytes(b'[{"kind": "dme", "url": "http://10.0.0.8/", "labels": {"host": "caf\xe9"}}]')
    with structlog.testing.capture_logs() as logs:
        kept = targets.current()
        targets.current()  # unchanged file: not parsed or logged again
    assert [t.url for t in kept] == ["http://10.0.0.7:5000/metrics"]
    assert len(logs) == 1 and logs[0]["log_level"] == "error"
    assert "not UTF-8: byte 0xe9 at offset 67 (line 1)" in logs[0]["error"]
    assert targets.last_error is not None and "0xe9" in targets.last_error


def test_unreadable_target_or_mapping_file_is_a_config_error(tmp_path: Path) -> None:
    folder = tmp_path / "targets.json"
    folder.mkdir()  # read_bytes raises IsADirectoryError
    targets = TargetSet(CollectorSettings(target_file=str(folder)))
    assert targets.current() == [] and "cannot read" in (targets.last_error or "")
    mapping = tmp_path / "map.toml"
    mapping.write_bytes(b'[[metric]]\nsource = "t\xe9mp"\n')
    with pytest.raises(ConfigError, match="not UTF-8: byte 0xe9"):
        load_mapping(mapping)


# -- end to end: a hostile page over real HTTP keeps its node up ------------------------------
def test_nan_bitmask_page_scrapes_up_with_its_samples(tmp_path: Path) -> None:
    """The scrape of issue 12: before, ``int(NaN)`` cost the page and the ``up`` series."""
    clock = Clock(T / 1000)
    store = make_store(f"sqlite:///{tmp_path / 'h.db'}", clock)
    page = DCGM_TEMP + 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",Hostname="n1"} NaN\n'

    async def run() -> list:
        async with PageServer({"/metrics": lambda: (200, page.encode())}) as server:
            target = Target("dcgm", server.url("/metrics"), {"cluster": "c"}, 1.0, 30.0)
            engine = engine_for(store, [target], tmp_path, lambda: clock.now)
            async with engine:
                reports = await engine.scrape_round(T)
                await engine.sink.flush()
        return reports

    try:
        (report,) = asyncio.run(run())
        assert report.up and report.samples == 1 and report.dropped == {"non_finite": 1}
    finally:
        store.close()


@pytest.mark.slow
def test_collect_once_with_a_nan_bitmask_and_a_latin1_targets_file(tmp_path: Path) -> None:
    """``hbmwatch collect --once`` as a person runs it: exit 0, the node up, the NaN counted;
    then the targets file gains a Latin-1 byte and the collector keeps scraping."""
    page = DCGM_TEMP + 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",Hostname="n1"} NaN\n'
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(page.encode()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"kind": "dcgm", "url": url, "labels": {"cluster": "c"}}]))
    env = clean_env(HBMWATCH_STORE__URL=f"sqlite:///{tmp_path / 'h.db'}")
    run = functools.partial(
        subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert run([*HBMWATCH, "migrate"]).returncode == 0
        once = run([*HBMWATCH, "collect", "--once", "--targets", str(targets)])
        assert once.returncode == 0, once.stdout + once.stderr
        assert "non_finite 1" in once.stdout and "yes" in once.stdout
        targets.write_bytes(targets.read_bytes().replace(b'"c"', b'"caf\xe9"'))
        bad = run([*HBMWATCH, "collect", "--once", "--targets", str(targets)])
        assert "Traceback" not in bad.stderr and "not UTF-8: byte 0xe9" in bad.stderr
        assert bad.stderr.count("not UTF-8") == 1
    finally:
        server.shutdown()
        server.server_close()


def _handler(body: bytes) -> type[BaseHTTPRequestHandler]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    return Page
