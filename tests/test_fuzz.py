"""Hypothesis against every parser: no exception escapes, bad input is counted or refused."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collector.exposition import parse
from collector.sources.amdsmi import (
    AmdSmiTranslator,
    gpus_from_json,
    gpus_from_monitor,
    gpus_from_text,
)
from collector.sources.dcgm import DcgmTranslator
from collector.sources.dme import DmeTranslator
from collector.sources.inference import InferenceTranslator
from collector.sources.mapped import load_mapping
from collector.sources.nvidia_smi import NvidiaSmiTranslator, parse_csv
from collector.sources.push import LatencyWindow, SampleBatch, StepTimes
from collector.spellings import dcgm, dme, vllm
from collector.spool import CorruptBatch, decode_batch
from collector.targets import parse_target_file
from hbmwatch.validation import ConfigError

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
names = st.sampled_from(
    [f.name for f in dme.FAMILIES]
    + [f.name for f in dcgm.FAMILIES]
    + [f"{n}_bucket" for n in vllm.PHASE_OF]
    + ["junk", "amd_gpu_clock"]
)
label_names = st.sampled_from(
    [
        "gpu",
        "gpu_id",
        "hostname",
        "Hostname",
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
label_values = st.one_of(
    st.sampled_from(["0", "1", "7", "cpx", "spx", "system", "+Inf", "x", "-1", "0.5", ""]),
    st.text(max_size=6),
)
values = st.one_of(
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(["NaN", "+Inf", "-Inf", "9223372036854775794", "1e400", "x"]),
)


@st.composite
def pages(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 25))):
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.text(max_size=40)))
            continue
        labels = draw(st.dictionaries(label_names, label_values, max_size=5))
        body = ",".join(
            f'{k}="{str(v).replace(chr(92), "").replace(chr(34), "")}"' for k, v in labels.items()
        )
        lines.append(f"{draw(names)}{{{body}}} {draw(values)}")
    return "\n".join(lines)


@FUZZ
@given(pages())
def test_translators_never_raise(page: str) -> None:
    parse(page)
    for translator in (
        DmeTranslator({"cluster": "c"}),
        DcgmTranslator(),
        InferenceTranslator({"service": "s"}),
    ):
        out = translator.translate_text(page, 1_800_000_000_000)
        for s in out.samples:
            assert s.value == s.value and abs(s.value) != float("inf")  # finite only
        assert sum(out.dropped.values()) >= 0


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
@given(json_tree)
def test_amdsmi_json_never_raises_past_value_error(tree: object) -> None:
    try:
        gpus = gpus_from_json(json.dumps(tree))
    except ValueError:
        return
    AmdSmiTranslator(host="h").translate(gpus, 0)


@FUZZ
@given(st.text(max_size=300))
def test_amdsmi_text_and_monitor_never_raise(text: str) -> None:
    t = AmdSmiTranslator(host="h")
    t.translate(gpus_from_text(text), 0)
    t.translate_monitor(gpus_from_monitor(text), 0)


@FUZZ
@given(st.text(max_size=300))
def test_nvidia_smi_never_raises_past_value_error(text: str) -> None:
    t = NvidiaSmiTranslator(host="h")
    with contextlib.suppress(ValueError):
        t.translate_csv(parse_csv(text), 0)
    out = t.translate_xml(text, 0)
    assert out.dropped["malformed"] <= 1


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
    for model in (SampleBatch, LatencyWindow, StepTimes):
        with contextlib.suppress(ValidationError):
            model.model_validate(data)


@FUZZ
@given(st.binary(max_size=200))
def test_spool_batches_refuse_cleanly(blob: bytes) -> None:
    with pytest.raises(CorruptBatch):
        decode_batch(blob)


@FUZZ
@given(st.text(max_size=200))
def test_target_and_mapping_files_refuse_with_config_errors(tmp_path_factory, text: str) -> None:  # type: ignore[no-untyped-def]
    folder: Path = tmp_path_factory.mktemp("f")
    for name in ("targets.json", "targets.toml"):
        path = folder / name
        path.write_text(text)
        with contextlib.suppress(ConfigError):
            parse_target_file(path)
    mapping = folder / "map.toml"
    mapping.write_text(text)
    with contextlib.suppress(ConfigError):
        load_mapping(mapping)
