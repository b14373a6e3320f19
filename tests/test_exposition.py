"""The cached text-format parser agrees with prometheus_client's and never raises."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.collector.exposition import SeriesCache, parse, parse_series
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import load_scenario

PROM_FIXTURES = [
    "upstream/amd-device-metrics-exporter/metrics_mini.prom",
    "upstream/amd-device-metrics-exporter/metricslist-doc-example-series.prom",
    "upstream/datadog-dcgm-exporter-fixture/metrics.txt",
]


def reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, dict(s.labels), s.value))
    return out


def _name(name: str) -> str:
    # prometheus_client appends _total to counter samples that lack it; the page does not.
    return name.removesuffix("_total")


def ours(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.series.name, s.series.label_dict(), s.value) for s in parse(text).samples]


def same(a: list, b: list) -> bool:
    def norm(rows: list) -> list:
        return sorted(
            (_name(n), sorted(lab.items()), "nan" if math.isnan(v) else v) for n, lab, v in rows
        )

    return norm(a) == norm(b)


@pytest.mark.parametrize("name", PROM_FIXTURES)
def test_agrees_with_prometheus_client_on_fixtures(fixtures_dir: Path, name: str) -> None:
    text = (fixtures_dir / name).read_text()
    assert same(ours(text), reference(text))
    assert parse(text).malformed == 0


def test_agrees_on_simulated_pages() -> None:
    sim = Simulation(load_scenario("default"), start_unix=1_800_000_000)
    sim.step()
    for page in (sim.node_page(0), sim.node_page(5), sim.service_page(0), sim.job_page(0)):
        assert page is not None
        assert same(ours(page), reference(page))


def test_readme_sample_with_elisions_counts_the_bad_lines(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "upstream/nvidia-dcgm-exporter/readme-sample-output.prom").read_text()
    page = parse(text)
    assert page.malformed == 2  # the two "..." lines upstream left in
    assert len(page.samples) == 3
    assert page.samples[2].value == float(9223372036854775794)  # the sentinel, as a float


def test_timestamps_escapes_and_odd_spacing() -> None:
    text = (
        'a{x="1 2",y="q\\"uote",z="back\\\\slash"}  7  1700000000000\nb 3\nc{d="nl\\nhere",} -Inf\n'
    )
    page = parse(text)
    assert page.malformed == 0
    a, b, c = page.samples
    assert a.series.label_dict() == {"x": "1 2", "y": 'q"uote', "z": "back\\slash"}
    assert (a.value, a.timestamp_ms) == (7.0, 1700000000000)
    assert (b.series.name, b.value) == ("b", 3.0)
    assert c.series.label_dict() == {"d": "nl\nhere"} and c.value == -math.inf


@pytest.mark.parametrize(
    "line",
    [
        "no_value",
        'm{a="1"',
        "m{a=1} 2",
        "m 1 2 3 4",
        '{a="1"} 2',
        'm{a="1",a="2"} 3',
        "m{} not-a-number",
        'm{1a="x"} 1',
    ],
)
def test_malformed_lines_are_counted_and_skipped(line: str) -> None:
    page = parse(f"good 1\n{line}\nalso_good 2\n")
    assert page.malformed == 1
    assert [s.series.name for s in page.samples] == ["good", "also_good"]
    assert page.first_errors


def test_series_cap_refuses_new_series_and_counts_them() -> None:
    cache = SeriesCache(limit=3)
    page = parse("\n".join(f'm{{i="{i}"}} 1' for i in range(5)), cache)
    assert len(page.samples) == 3 and page.series_capped == 2
    again = parse('m{i="0"} 2\nm{i="9"} 2', cache)  # known series still flow
    assert len(again.samples) == 1 and again.series_capped == 1


_label_value = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_label_name = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not s.startswith("__")
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
            st.dictionaries(_label_name, _label_value, max_size=4),
            st.floats(allow_nan=False, width=64),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_round_trip_against_reference_on_generated_pages(rows: list) -> None:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = []
    for name, labels, value in rows:
        body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}")
    text = "\n".join(lines) + "\n"
    try:
        expected = reference(text)
    except ValueError:
        return  # the reference refuses this page; ours must still not raise
    first: dict[tuple, tuple] = {}
    for name, labels, value in expected:  # ours refuses a repeated series; the reference not
        first.setdefault((name, tuple(sorted(labels.items()))), (name, labels, value))
    assert same(ours(text), list(first.values()))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_no_exception_escapes_on_arbitrary_text(text: str) -> None:
    page = parse(text)
    assert page.malformed + len(page.samples) <= text.count("\n") + 1


def test_parse_series_rejects_trailing_garbage() -> None:
    with pytest.raises(ValueError):
        parse_series('m{a="1"} junk')
