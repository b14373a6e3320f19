"""Hypothesis against every parser entry point: no exception escapes, bad input is counted.

Bounded and derandomized (``FUZZ``) so CI runs the same examples every time.  Pages are
built from the spellings the parsers know, with hostile values (NaN, +-Inf, 1e400, lone
surrogates, non-ASCII digits), so the fuzzer reaches the code behind the first lookup:
the five escapes of issue 12 hid there.  This file: exporter pages, push payloads, spool
batches, target and mapping files; tests/test_parsers_fuzz.py: vendor commands and
libraries (amd-smi, nvidia-smi, NVML, amdsmi).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hbmwatch.collector.exposition import parse
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.sources.mapped import MappedTranslator, Mapping_, load_mapping
from hbmwatch.collector.sources.push import (
    LatencyWindow,
    SampleBatch,
    StepTimes,
    samples_from_batch,
    samples_from_latencies,
    samples_from_steps,
)
from hbmwatch.collector.spellings import dcgm, dme, vllm
from hbmwatch.collector.spool import CorruptBatch, decode_batch
from hbmwatch.collector.targets import parse_target_file
from hbmwatch.collector.translate import Collected
from hbmwatch.metrics import DROP_REASONS
from hbmwatch.validation import ConfigError

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: Names whose values take more than a factor (bitmasks, tick counters, quantiles) come up
#: half the time: a uniform draw over some 300 families hardly ever reached them.
names = st.one_of(
    st.sampled_from(
        [
            *dcgm.REASONS_FIELDS,
            dme.ACCUMULATION_COUNTER,
            "gpu_violation_ppt_residency_accumulated",
            "gpu_violation_socket_thermal_residency_percentage",
            *vllm.TRITON_SUMMARIES,
            "vllm:e2e_request_latency_seconds_bucket",
            "my_temp",
        ]
    ),
    st.sampled_from(
        [f.name for f in dme.FAMILIES]
        + [f.name for f in dcgm.FAMILIES]
        + [f"{n}_bucket" for n in vllm.PHASE_OF]
        + [f"{n}_count" for n in vllm.PHASE_OF]
        + ["junk", "amd_gpu_clock"]
    ),
)
label_names = st.sampled_from(
    [
        "gpu",
        "gpu_id",
        "hostname",
        "Hostname",
        "HOSTNAME",
        "serial_number",
        "le",
        "hbm_index",
        "link_index",
        "clock_type",
        "gpu_partition_id",
        "model_name",
        "gpu_compute_partition_type",
        "UUID",
        "GPU_I_ID",
        "quantile",
    ]
)
#: Text with lone surrogates and non-ASCII digits (``isdigit()`` but not ``int()``).
hostile_text = st.lists(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        st.sampled_from("²³¹٣0x.é"),
    ),
    max_size=8,
).map("".join)
label_values = st.one_of(
    st.sampled_from(["0", "1", "7", "²", "cpx", "spx", "system", "+Inf", "x", "-1", "0.5", ""]),
    hostile_text,
)
special_values = ["NaN", "+Inf", "-Inf", "Inf", "9223372036854775794", "1e400", "-1", "4.5", "x"]
values = st.one_of(
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(special_values),
)


#: Label sets that name a device (or a served model), so lines get past the device lookup.
identities = st.sampled_from(
    [
        {},
        {"gpu": "0", "Hostname": "n1"},
        {"gpu": "1", "hostname": "n1", "GPU_I_ID": "2"},
        {"gpu_id": "0", "hostname": "n1"},
        {"gpu_id": "9", "hostname": "n1", "gpu_compute_partition_type": "cpx"},
        {"model_name": "m", "le": "+Inf"},
        {"gpu": "0", "hostname": "n1", "le": "0.5"},
    ]
)


@st.composite
def pages(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 25))):
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.text(max_size=40)))
            continue
        labels = {
            **draw(identities),
            **draw(st.dictionaries(label_names, label_values, max_size=3)),
        }
        body = ",".join(
            f'{k}="{str(v).replace(chr(92), "").replace(chr(34), "")}"' for k, v in labels.items()
        )
        lines.append(f"{draw(names)}{{{body}}} {draw(values)}")
    return "\n".join(lines)


MAPPING = Mapping_.model_validate(
    {
        "metric": [
            {"source": "my_temp", "metric": "gpu_memory_temperature_celsius",
             "labels": {"gpu": "gpu", "host": "hostname"}},
        ],
        "histogram": [{"source": "vllm:e2e_request_latency_seconds", "phase": "e2e"}],
    }
)  # fmt: skip


def assert_clean(out: Collected) -> None:
    """Only finite samples come out, and every drop has a reason the collector reports."""
    for s in out.samples:
        assert math.isfinite(s.value), s
    assert set(out.dropped) <= set(DROP_REASONS), out.dropped


@FUZZ
@given(st.lists(pages(), min_size=1, max_size=2))
def test_translators_never_raise(scrapes: list[str]) -> None:
    """Several scrapes 10 s apart through the same translators (tick periods, windows)."""
    translators = (
        DmeTranslator({"cluster": "c"}),
        DcgmTranslator(),
        InferenceTranslator({"service": "s"}),
        MappedTranslator(MAPPING, {"cluster": "c"}),
    )
    for i, page in enumerate(scrapes):
        parse(page)
        for translator in translators:
            assert_clean(translator.translate_text(page, 1_800_000_000_000 + 10_000 * i))


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(),
    st.integers(),
    st.text(max_size=8),
    st.fixed_dictionaries(
        {
            "value": st.one_of(st.floats(), st.text(max_size=5)),
            "unit": st.sampled_from(["W", "C", "MHz", "%", "??", ""]),
        }
    ),
)
json_tree = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "gpu",
                    "temperature",
                    "mem",
                    "hotspot",
                    "power",
                    "socket_power",
                    "throttle",
                    "hbm_0",
                    "pcie",
                    "speed",
                    "ppt_accumulated",
                    "accumulation_counter",
                    "gpu_data",
                    "usage",
                    "gfx_activity",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "samples",
                "service",
                "phase",
                "window_end",
                "latencies_seconds",
                "step_seconds",
                "metric",
            ]
        ),
        json_tree,
        max_size=4,
    )
)
def test_push_payloads_refuse_with_validation_errors(data: dict) -> None:
    for model, convert in (
        (SampleBatch, samples_from_batch),
        (LatencyWindow, samples_from_latencies),
        (StepTimes, samples_from_steps),
    ):
        try:
            payload = model.model_validate(data)
        except ValidationError:
            continue
        with contextlib.suppress(ValueError):  # a window_end that is no time: the API's 422
            convert(payload)  # type: ignore[operator]


@FUZZ
@given(st.binary(max_size=200))
def test_spool_batches_refuse_cleanly(blob: bytes) -> None:
    with pytest.raises(CorruptBatch):
        decode_batch(blob)


file_bytes = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"[\xe9]", b'[{"kind": "dme", "url": "http://h\xe9/"}]', b"[" * 5000]),
)


@FUZZ
@given(file_bytes)
def test_target_and_mapping_files_refuse_with_config_errors(tmp_path_factory, data: bytes) -> None:  # type: ignore[no-untyped-def]
    folder: Path = tmp_path_factory.mktemp("f")
    for name in ("targets.json", "targets.toml"):
        path = folder / name
        path.write_bytes(data)
        with contextlib.suppress(ConfigError):
            parse_target_file(path)
    mapping = folder / "map.toml"
    mapping.write_bytes(data)
    with contextlib.suppress(ConfigError):
        load_mapping(mapping)
