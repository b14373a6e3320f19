"""Every source adapter on real exporter output: canonical names, real values, SI units."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hbmwatch.collector.sources.amdsmi import (
    AmdSmiCollector,
    AmdSmiLibraryCollector,
    AmdSmiTranslator,
    SourceUnavailable,
    gpus_from_json,
    gpus_from_monitor,
    gpus_from_text,
    import_amdsmi,
)
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator, histogram_quantile
from hbmwatch.collector.sources.mapped import MappedTranslator, load_mapping
from hbmwatch.collector.sources.nvidia_smi import NvidiaSmiTranslator, parse_csv
from hbmwatch.collector.sources.nvml import NvmlCollector
from hbmwatch.collector.sources.push import (
    LatencyWindow,
    SampleBatch,
    StepTimes,
    samples_from_batch,
    samples_from_latencies,
    samples_from_steps,
)
from hbmwatch.collector.translate import Collected
from hbmwatch.store.registry import validate_series
from tests.fakes.nvml import FakeNvml

T = 1_800_000_000_000


def by(collected: Collected, metric: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in collected.samples
        if s.series.metric == metric and all(s.series.label(k) == v for k, v in labels.items())
    ]


def canonical(collected: Collected) -> None:
    for s in collected.samples:
        validate_series(s.series)  # names, labels and values the store will accept


# -- AMD Device Metrics Exporter --------------------------------------------------------------
def test_dme_old_build_with_upper_case_labels(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "upstream/amd-device-metrics-exporter/metrics_mini.prom").read_text()
    out = DmeTranslator({"cluster": "c", "rack": "r", "host": "node1"}).translate_text(text, T)
    canonical(out)
    assert by(out, "gpu_power_watts") == [41.0]  # package/usage aliases give one series
    (device,) = out.devices.values()
    assert device.serial == "692247001282" and device.uuid.startswith("6699c0a8")
    assert device.gpu == "0" and device.host == "node1" and device.vendor == "amd"
    assert not out.dropped  # old names it does not keep are ignored, not errors


def test_dme_doc_series_clocks_and_xgmi(fixtures_dir: Path) -> None:
    path = fixtures_dir / "upstream/amd-device-metrics-exporter/metricslist-doc-example-series.prom"
    out = DmeTranslator({"cluster": "c"}).translate_text(path.read_text(), T)
    canonical(out)
    assert by(out, "gpu_clock_hertz", domain="memory", gpu="0") == [900e6]
    assert by(out, "gpu_clock_hertz", domain="compute", gpu="0") == [132e6]
    assert by(out, "gpu_clock_hertz", domain="soc", gpu="5") == [29e6]
    rx = by(out, "gpu_fabric_bytes_total", fabric="xgmi", direction="rx", link="1")
    assert rx == [2.776148269e9 * 1024]  # KB -> bytes
    assert len(by(out, "gpu_fabric_bytes_total", direction="tx")) == 8
    assert {s.series.label("host") for s in out.samples} == {"xxxx"}


def test_dme_prefix_cpx_partitions_stacks_and_violations() -> None:
    lines = []
    for gpu_id in range(16):  # two physical GPUs in CPX: 8 partitions each
        labels = (
            f'card_model="AMD Instinct MI300X",gpu_compute_partition_type="cpx",'
            f'gpu_memory_partition_type="nps4",gpu_id="{gpu_id}",'
            f'gpu_partition_id="{gpu_id % 8}",hostname="h",serial_number="s{gpu_id // 8}"'
        )
        lines.append(f"amd_gpu_gfx_activity{{{labels}}} 50")
        if gpu_id % 8 == 0:
            lines.append(f"amd_gpu_memory_temperature{{{labels}}} 61")
            lines.append(f'amd_gpu_hbm_temperature{{{labels},hbm_index="3"}} 64')
            lines.append(f"amd_gpu_violation_current_accumulated_counter{{{labels}}} 3808991")
            lines.append(f"amd_gpu_violation_ppt_residency_accumulated{{{labels}}} 585613")
            lines.append(f"amd_gpu_violation_hbm_thermal_residency_percentage{{{labels}}} 12")
            lines.append(f"amd_gpu_energy_consumed{{{labels}}} 2500000")
    out = DmeTranslator().translate_text("\n".join(lines), T)
    canonical(out)
    assert sorted(by(out, "gpu_memory_temperature_celsius")) == [61.0, 61.0]
    temps = [s for s in out.samples if s.series.metric == "gpu_memory_temperature_celsius"]
    assert {s.series.label("gpu") for s in temps} == {"0", "1"}
    assert all(s.series.label("partition") == "" for s in temps)  # physical: no partition
    activity = [s for s in out.samples if s.series.metric == "gpu_utilization_ratio"]
    assert len(activity) == 16 and activity[0].value == 0.5
    assert {s.series.label("partition") for s in activity} == {str(i) for i in range(8)}
    assert by(out, "gpu_hbm_stack_temperature_celsius", stack="3") == [64.0, 64.0]
    assert by(out, "gpu_throttle_seconds_total", reason="power") == [585.613] * 2  # 1 ms ticks
    assert by(out, "gpu_throttle_active", reason="hbm_thermal") == [1.0, 1.0]
    assert by(out, "gpu_energy_joules_total") == [2.5] * 2  # uJ -> J
    assert {d.compute_partition for d in out.devices.values()} == {"cpx"}


def test_dme_tick_period_is_measured_and_snapped() -> None:
    t = DmeTranslator()

    def page(ticks: int, ppt: int) -> str:
        labels = 'gpu_id="0",hostname="h",serial_number="s"'
        return (
            f"gpu_violation_current_accumulated_counter{{{labels}}} {ticks}\n"
            f"gpu_violation_ppt_residency_accumulated{{{labels}}} {ppt}\n"
        )

    t.translate_text(page(0, 0), T)
    # 10 s of wall time moved the counter by 1,000,000 ticks: a 10 us tick
    out = t.translate_text(page(1_000_000, 500_000), T + 10_000)
    assert by(out, "gpu_throttle_seconds_total", reason="power") == [pytest.approx(5.0)]


# -- dcgm-exporter ----------------------------------------------------------------------------
def test_dcgm_datadog_capture(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "upstream/datadog-dcgm-exporter-fixture/metrics.txt").read_text()
    out = DcgmTranslator({"cluster": "c", "rack": "r"}).translate_text(text, T)
    canonical(out)
    assert by(out, "gpu_power_watts") == [8.969]
    assert by(out, "gpu_energy_joules_total") == [128996.013]  # mJ -> J
    assert by(out, "gpu_clock_hertz", domain="compute") == [300e6]
    assert by(out, "gpu_memory_temperature_celsius") == []  # only on the dummy series
    assert sum(by(out, "gpu_throttle_active")) == 0  # bitmask 1 = idle, not a throttle
    assert len(by(out, "gpu_throttle_active")) == 6
    assert out.dropped["no_device"] == 4  # the unlabelled dummies: memory temp, 3 row-remap
    assert out.dropped["unmapped"] >= 5  # profiling fields hbmwatch does not keep
    hosts = {d.host for d in out.devices.values()}
    assert hosts == {"424773df46e0", "551bdf382151", "ip-11111"}  # Hostname, old spelling
    assert {d.sku for d in out.devices.values()} == {"Tesla T4", "NVIDIA A10G"}
    assert by(out, "gpu_memory_bandwidth_utilization_ratio", host="ip-11111") == [0.000003]


def test_dcgm_readme_sentinel_dropped_and_counted(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "upstream/nvidia-dcgm-exporter/readme-sample-output.prom").read_text()
    out = DcgmTranslator({"host": "node9"}).translate_text(text, T)
    assert out.dropped["sentinel"] == 1 and out.dropped["malformed"] == 2
    assert by(out, "gpu_clock_hertz", domain="compute") == [139e6]
    assert by(out, "gpu_memory_temperature_celsius") == []


def test_dcgm_new_names_lower_case_hostname_mig_and_bits() -> None:
    labels = (
        'gpu="2",UUID="GPU-abc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",'
        'hostname="n4",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"'
    )
    text = (
        f"DCGM_FI_DEV_MEMORY_TEMP_CELSIUS{{{labels}}} 52\n"
        f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}} 68\n"
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_L7_TOTAL{{{labels}}} 3\n"
        f"DCGM_FI_DEV_POWER_VIOLATION{{{labels}}} 2500000000\n"
    )
    out = DcgmTranslator().translate_text(text, T)
    canonical(out)
    assert by(out, "gpu_memory_temperature_celsius", host="n4", gpu="2", partition="1") == [52.0]
    active = {
        s.series.label("reason"): s.value
        for s in out.samples
        if s.series.metric == "gpu_throttle_active"
    }
    assert active["power"] == 1.0 and active["hw_thermal"] == 1.0 and active["sw_thermal"] == 0
    assert by(out, "gpu_fabric_errors_total", link="7", error="crc_flit") == [3.0]
    assert by(out, "gpu_throttle_seconds_total", reason="power") == [2.5]
    (device,) = out.devices.values()
    assert device.sku == "H100" and device.compute_partition == "3g.40gb"


# -- amd-smi ----------------------------------------------------------------------------------
AMDSMI = "upstream/amdsmi/"


def test_amdsmi_json_bare_list_and_envelope(fixtures_dir: Path) -> None:
    raw = (fixtures_dir / AMDSMI / "changelog-examples/amd-smi_metric_-p_--json.txt").read_text()
    body = raw[raw.index("[") :]
    t = AmdSmiTranslator(host="mi300")
    bare = t.translate(gpus_from_json(body), T)
    wrapped = t.translate(gpus_from_json(json.dumps({"gpu_data": json.loads(body)})), T)
    assert by(bare, "gpu_power_watts") == by(wrapped, "gpu_power_watts") == [10.0]


@pytest.mark.parametrize(
    ("name", "metric", "labels", "expected"),
    [
        ("amd-smi_metric_--pcie.txt", "gpu_pcie_link_speed_transfers_per_second", {}, [32e9] * 2),
        ("amd-smi_metric_--pcie.txt", "gpu_pcie_naks_total", {"direction": "tx"}, [0.0, 0.0]),
        ("amd-smi_metric_--power.txt", "gpu_power_watts", {}, [11.0, 17.0]),
        (
            "amd-smi_metric_--ecc_--ecc-blocks.txt",
            "gpu_ecc_errors_total",
            {"severity": "deferred"},
            [0.0],
        ),
        (
            "amd-smi_metric_--throttle.txt",
            "gpu_throttle_seconds_total",
            {"reason": "socket_thermal"},
            [2.19, 18.01],
        ),
        (
            "amd-smi_metric_--throttle.txt",
            "gpu_throttle_active",
            {"reason": "hbm_thermal"},
            [0.0, 0.0],
        ),
    ],
)
def test_amdsmi_text_output(
    fixtures_dir: Path, name: str, metric: str, labels: dict, expected: list
) -> None:
    text = (fixtures_dir / AMDSMI / "changelog-examples" / name).read_text()
    out = AmdSmiTranslator(host="mi300").translate(gpus_from_text(text), T)
    canonical(out)
    assert by(out, metric, **labels) == pytest.approx(expected)


def test_amdsmi_monitor_cpx_sensors_on_xcp_0(fixtures_dir: Path) -> None:
    text = (
        fixtures_dir / AMDSMI / "cli-doc-examples/amd-smi_monitor_mi300x_cpx_nps4.txt"
    ).read_text()
    out = AmdSmiTranslator(host="h").translate_monitor(gpus_from_monitor(text), T)
    canonical(out)
    assert by(out, "gpu_power_watts") == [183.0, 182.0]
    assert by(out, "gpu_memory_temperature_celsius", gpu="1") == [46.0]
    assert by(out, "gpu_memory_total_bytes", gpu="0") == [192.0 * 2**30]


def test_amdsmi_monitor_32_devices(fixtures_dir: Path) -> None:
    text = (fixtures_dir / AMDSMI / "changelog-examples/amd-smi_monitor_-p_-t_-v.txt").read_text()
    out = AmdSmiTranslator(host="h").translate_monitor(gpus_from_monitor(text), T)
    assert len(by(out, "gpu_power_watts")) == 32
    assert by(out, "gpu_memory_total_bytes", gpu="0") == [196300 * 2**20]


def test_amdsmi_collector_runs_the_command_and_library_import_fails_clearly() -> None:
    calls = []

    def runner(argv: list[str]) -> str:
        calls.append(argv)
        return json.dumps(
            {"gpu_data": [{"gpu": 0, "temperature": {"mem": {"value": 58, "unit": "C"}}}]}
        )

    out = AmdSmiCollector(host="h", runner=runner).collect(T)
    assert calls == [["amd-smi", "metric", "--json"]]
    assert by(out, "gpu_memory_temperature_celsius") == [58.0]
    with pytest.raises(SourceUnavailable, match="amdsmi library cannot be used"):
        import_amdsmi()


def test_amdsmi_library_metrics() -> None:
    class Lib:
        def amdsmi_init(self) -> None: ...
        def amdsmi_shut_down(self) -> None: ...
        def amdsmi_get_processor_handles(self) -> list[int]:
            return [0]

        def amdsmi_get_gpu_metrics_info(self, handle: int) -> dict:
            return {
                "temperature_mem": 61,
                "temperature_hbm": [60, 62, "N/A", 61],
                "current_socket_power": 512,
                "average_umc_activity": 40,
                "accumulation_counter": 1000,
                "hbm_thm_residency_acc": 250,
                "xgmi_read_data_acc": [10, 20],
                "energy_accumulator": 65536,
            }

    source = AmdSmiLibraryCollector(Lib(), host="h")
    source.open()
    out = source.collect(T)
    canonical(out)
    assert by(out, "gpu_hbm_stack_temperature_celsius", stack="1") == [62.0]
    assert len(by(out, "gpu_hbm_stack_temperature_celsius")) == 3
    assert by(out, "gpu_memory_bandwidth_utilization_ratio") == [0.4]
    assert by(out, "gpu_throttle_seconds_total", reason="hbm_thermal") == [0.25]
    assert by(out, "gpu_fabric_bytes_total", link="1") == [20 * 1024.0]
    assert by(out, "gpu_energy_joules_total") == [pytest.approx(1.0, rel=1e-3)]


# -- nvidia-smi -------------------------------------------------------------------------------
def test_nvidia_smi_xml_of_the_real_h200(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "real/h200/nvsmi_q.xml").read_text()
    out = NvidiaSmiTranslator(host="h200").translate_xml(text, T)
    canonical(out)
    assert by(out, "gpu_memory_temperature_celsius") == [40.0]
    assert by(out, "gpu_hotspot_temperature_celsius") == [37.0]
    assert by(out, "gpu_power_watts") == [126.45] and by(out, "gpu_power_limit_watts") == [700.0]
    assert by(out, "gpu_clock_hertz", domain="memory") == [3201e6]
    assert by(out, "gpu_throttle_seconds_total", reason="power") == [pytest.approx(80.707393)]
    assert by(out, "gpu_memory_total_bytes") == [143771 * 2**20]
    (device,) = out.devices.values()
    assert device.sku == "H200" and device.serial == "1653924101904"


def test_nvidia_smi_csv_of_the_real_h200(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "real/h200/nvsmi_samples.txt").read_text()
    block = text.split("## query csv\n")[1].split("##")[0]
    out = NvidiaSmiTranslator(host="h200").translate_csv(parse_csv(block), T)
    canonical(out)
    assert by(out, "gpu_power_watts") == [102.99]
    assert by(out, "gpu_clock_hertz", domain="compute") == [555e6]
    assert by(out, "gpu_memory_temperature_celsius") == [39.0]


@pytest.mark.parametrize("gpu", ["h100-80gb-hbm3", "h200"])
def test_nvidia_smi_captures_idle_and_load(fixtures_dir: Path, gpu: str) -> None:
    text = (
        fixtures_dir / f"upstream/nvidia-smi-captures/linux-x86_64__nvidia-{gpu}__590.48.01.txt"
    ).read_text()
    sections = re.split(r"#{20,}\n# (\w+) :: query-gpu \(csv, what the exporter parses\)\n", text)
    blocks = {sections[i]: sections[i + 1] for i in range(1, len(sections) - 1, 2)}
    readings = {}
    for phase in ("idle", "load"):
        csv_text = blocks[phase].split("#" * 80 + "\n", 2)[1].split("\n\n")[0]
        out = NvidiaSmiTranslator().translate_csv(parse_csv(csv_text), T)
        canonical(out)
        readings[phase] = out
        assert out.dropped["unsupported"] >= 0
    assert by(readings["load"], "gpu_power_watts")[0] > by(readings["idle"], "gpu_power_watts")[0]
    assert by(readings["load"], "gpu_memory_temperature_celsius")[0] > 20


# -- NVML -------------------------------------------------------------------------------------
def test_nvml_reads_fields_and_remembers_what_is_unsupported() -> None:
    nvml = FakeNvml()
    source = NvmlCollector(nvml, {"cluster": "c"}, host="h200")
    source.open()
    first = source.collect(T)
    canonical(first)
    assert by(first, "gpu_memory_temperature_celsius") == [40.0]
    assert by(first, "gpu_power_watts") == [125.75]
    assert by(first, "gpu_clock_hertz", domain="memory") == [3201e6]
    assert by(first, "gpu_memory_bandwidth_utilization_ratio") == [0.03]  # no GPM: util.memory
    assert by(first, "gpu_throttle_seconds_total", reason="power")[0] == pytest.approx(81.707393)
    assert "NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER" in source.unsupported["0"]
    assert "gpm" not in source.unsupported["0"]
    second = source.collect(T + 1000)
    assert second.dropped["unsupported"] < first.dropped["unsupported"]  # not asked again
    for _ in range(3):
        last = source.collect(T + 2000)
    assert by(last, "gpu_throttle_active", reason="power") == [1.0]
    source.close()
    assert nvml.calls == ["init", "shutdown"]


# -- inference servers ------------------------------------------------------------------------
def _vllm_page(counts: list[int], total_sum: float, model: str = "m") -> str:
    from hbmwatch.collector.spellings.vllm import REQUEST_LATENCY_BUCKETS

    edges = [*REQUEST_LATENCY_BUCKETS, "+Inf"]
    cumulative = np.cumsum(counts)
    lines = [
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{e}",model_name="{model}"}} {c}'
        for e, c in zip(edges, cumulative, strict=True)
    ]
    lines.append(
        f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="{model}"}} '
        f"{cumulative[-1]}"
    )
    lines.append(
        f'vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="{model}"}} {total_sum}'
    )
    return "\n".join(lines) + "\n"


def test_vllm_window_quantiles_from_bucket_deltas() -> None:
    t = InferenceTranslator({"host": "n1", "gpu": "3", "service": "chat"}, window_seconds=60)
    zeros = [0] * 22
    first = t.translate_text(_vllm_page(zeros, 0), T)
    assert by(first, "workload_requests_total") == [0.0]
    assert by(first, "workload_latency_seconds") == []  # one snapshot: no window yet
    # 100 requests land: 50 in (1.0, 1.5], 49 in (1.5, 2.0], 1 in (60, 120]
    counts = zeros.copy()
    counts[4], counts[5], counts[15] = 50, 49, 1
    out = t.translate_text(_vllm_page(counts, 180.0), T + 15_000)
    canonical(out)
    q = {
        s.series.label("quantile"): s.value
        for s in out.samples
        if s.series.metric == "workload_latency_seconds"
    }
    width = {
        s.series.label("quantile"): s.value
        for s in out.samples
        if s.series.metric == "workload_latency_resolution_seconds"
    }
    assert q["0.5"] == pytest.approx(1.5) and width["0.5"] == pytest.approx(0.5)
    assert q["0.99"] == pytest.approx(2.0) and width["0.99"] == pytest.approx(0.5)
    assert by(out, "workload_window_requests") == [100.0]
    labels = next(s.series for s in out.samples).label_dict
    assert labels["service"] == "chat" and labels["model"] == "m" and labels["phase"] == "e2e"


def test_vllm_restart_resets_the_window_instead_of_negative_counts() -> None:
    t = InferenceTranslator({"service": "s"})
    counts = [0] * 22
    counts[3] = 100
    t.translate_text(_vllm_page([0] * 22, 0), T)
    t.translate_text(_vllm_page(counts, 90), T + 10_000)
    after = t.translate_text(_vllm_page([0] * 22, 0), T + 20_000)  # server restarted
    assert by(after, "workload_window_requests") == []
    assert all(v >= 0 for v in by(after, "workload_requests_total"))


def test_histogram_quantile_in_the_inf_bucket_reports_the_last_bound() -> None:
    uppers = np.array([1.0, 2.0, np.inf])
    assert histogram_quantile(0.99, uppers, np.array([1, 1, 98])) == (2.0, 2.0)


def test_triton_summary_passes_through() -> None:
    text = 'nv_inference_request_summary_us{model="resnet",version="1",quantile="0.99"} 2500\n'
    out = InferenceTranslator({"service": "img"}).translate_text(text, T)
    assert by(out, "workload_latency_seconds", quantile="0.99") == [0.0025]


# -- mapped targets and push ------------------------------------------------------------------
def test_mapping_file_maps_metrics_and_histograms(tmp_path: Path) -> None:
    path = tmp_path / "map.toml"
    path.write_text(
        '[[metric]]\nsource = "node_gpu_mem_c"\nmetric = "gpu_memory_temperature_celsius"\n'
        'labels = { gpu = "index" }\n\n'
        '[[histogram]]\nsource = "train_step_seconds"\nphase = "step"\n'
        'labels = { service = "job_name" }\n'
    )
    t = MappedTranslator(load_mapping(path), {"host": "n3", "cluster": "c"})
    page = (
        'node_gpu_mem_c{index="2"} 71\nother_metric 5\n'
        'train_step_seconds_bucket{job_name="pt",le="1.0"} 0\n'
        'train_step_seconds_bucket{job_name="pt",le="+Inf"} 0\n'
        'train_step_seconds_count{job_name="pt"} 0\n'
    )
    out = t.translate_text(page, T)
    canonical(out)
    assert by(out, "gpu_memory_temperature_celsius", host="n3", gpu="2") == [71.0]
    assert by(out, "workload_requests_total", service="pt", phase="step") == [0.0]
    assert out.dropped["unmapped"] == 1


def test_mapping_file_errors_name_the_field(tmp_path: Path) -> None:
    from hbmwatch.validation import ConfigError

    path = tmp_path / "bad.toml"
    path.write_text('[[metric]]\nsource = "x"\nmetric = "not_a_metric"\n')
    with pytest.raises(ConfigError, match=r"metric\[0\].metric: 'not_a_metric'"):
        load_mapping(path)
    path.write_text('[[histogram]]\nsource = "x"\nphase = "warmup"\n')
    with pytest.raises(ConfigError, match=r"histogram\.0\.phase"):
        load_mapping(path)


def test_push_payloads_become_canonical_samples() -> None:
    batch = SampleBatch.model_validate(
        {
            "samples": [
                {
                    "metric": "gpu_power_watts",
                    "labels": {"host": "h", "gpu": "0"},
                    "timestamp": "2027-01-15T08:00:00Z",
                    "value": 300.5,
                }
            ]
        }
    )
    out = samples_from_batch(batch)
    assert out.samples[0].timestamp_ms == T and out.samples[0].value == 300.5
    window = LatencyWindow(
        service="chat",
        phase="ttft",
        host="h",
        gpu="1",
        window_end=1_800_000_000,
        latencies_seconds=list(np.linspace(0, 1, 101)),
    )
    lat = samples_from_latencies(window)
    canonical(lat)
    assert by(lat, "workload_latency_seconds", quantile="0.5") == [pytest.approx(0.5)]
    assert by(lat, "workload_latency_resolution_seconds", quantile="0.99") == [0.0]
    steps = samples_from_steps(
        StepTimes(service="pt", window_end="2027-01-15T08:00:00Z", step_seconds=[2.0, 2.1, 2.2])
    )
    assert by(steps, "workload_window_requests", phase="step") == [3.0]
    with pytest.raises(ValueError, match="negative or not finite"):
        LatencyWindow(service="x", window_end=0, latencies_seconds=[0.1, -1])
