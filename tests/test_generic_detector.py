"""The generic detector in the service: user series from the mapped source to findings."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from hbmwatch.alerts.grouping import cause_of
from hbmwatch.alerts.labels import alert_labels
from hbmwatch.collector.targets import Target
from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.frame import Entities, Frame, RawSeries
from hbmwatch.detectors.frame_builder import FrameBuilder
from hbmwatch.detectors.generic import Series, SeriesAnomalies
from hbmwatch.detectors.rootcause import RootCause
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.status import snapshot_from_frame
from hbmwatch.store.feed import SampleBlock
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import Cause, FindingKind
from tests.conftest import Clock
from tests.test_collector import PageServer, engine_for

T0 = 1_800_000_000_000
LABELS = {"cluster": "c", "rack": "r0", "host": "n1", "series": "queue_depth"}
KEY = SeriesKey("user_series_value", LABELS).text


def values(n: int, spike: int | None = None, seed: int = 0) -> np.ndarray:
    x = 100 + np.random.default_rng(seed).normal(0, 1, n)
    if spike is not None:
        x[spike] += 40
    return x


def frame_of(raw: list[RawSeries], start_ms: int, end_ms: int, step_ms: int = 1000) -> Frame:
    steps = (end_ms - start_ms) // step_ms
    f = Frame(start_ms, step_ms, steps, Entities(), Entities(), Entities(), {},
              np.zeros((0, 8, steps)), {}, {}, {}, {}, {})  # fmt: skip
    f.raw = raw
    return f


def test_a_restart_keeps_the_baselines(tmp_path: Path) -> None:
    """State through JSON halfway gives the scores and findings of one uninterrupted run."""
    t, x = T0 + 60_000 * np.arange(600), values(600, spike=450)
    whole = SeriesAnomalies()
    found, (scores,) = whole.feed([Series(KEY, LABELS, t, x)])
    first = SeriesAnomalies()
    first.feed([Series(KEY, LABELS, t[:300], x[:300])])
    second = SeriesAnomalies()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    found2, (rest,) = second.feed([Series(KEY, LABELS, t[300:], x[300:])])
    np.testing.assert_array_equal(rest, scores[300:])
    assert [f.id for f in found2] == [f.id for f in found] != []


def test_no_sample_is_scored_twice_across_cycles() -> None:
    """A frame overlapping the last one (a backfill) scores only the samples it had not."""
    t, x = T0 + 1000 * np.arange(150), values(150)
    det = SeriesAnomalies()
    det.update(frame_of([RawSeries(KEY, LABELS, t[:100], x[:100])], T0, T0 + 100_000))
    again = frame_of([RawSeries(KEY, LABELS, t[50:], x[50:])], T0 + 50_000, T0 + 150_000)
    det.update(again)
    once = SeriesAnomalies()
    once.feed([Series(KEY, LABELS, t, x)])
    assert json.dumps(det.state_dict()) == json.dumps(once.state_dict())
    scored = again.scores["series"][0]
    assert np.isnan(scored[:50]).all() and not np.isnan(scored[50:]).any()


def test_a_five_minute_series_is_scored_once_per_sample_under_a_one_second_step(
    store: Store, clock: Clock
) -> None:
    """Through the store and the runner, hour-long cycles of 1 s steps: the detector learns
    exactly the series' own samples, as feeding them directly does, and finds the spike."""
    n, every = 288, 300_000  # a day at 5 minutes
    t0 = int(clock() * 1000) // every * every + every
    t, x = t0 + every * np.arange(n), values(n, spike=250)
    key = SeriesKey("user_series_value", LABELS)
    runner = DetectionRunner(
        store,
        default_detectors(),
        settle_seconds=0,
        backfill_seconds=2 * 86_400,
        context=Context(),
        clock=clock,
    )
    runner.start()
    hour, written = 3_600_000, 0
    for end in range(t0 + hour, int(t[-1]) + 2 * hour, hour):
        upto = int(np.searchsorted(t, end))
        clock.now = end / 1000
        store.write([Sample(key, int(t[i]), float(x[i])) for i in range(written, upto)])
        written = upto
        runner.cycle(end)
    direct = SeriesAnomalies()
    found, _ = direct.feed([Series(key.text, LABELS, t, x)])
    (det,) = [d for d in runner.detectors if d.name == "series"]
    assert json.dumps(det.state_dict()) == json.dumps(direct.state_dict())
    stored = store.findings.query(kind=FindingKind.SERIES_ANOMALY)
    assert [(f.id, f.started_ms) for f in stored] == [(f.id, f.started_ms) for f in found]
    assert stored and stored[0].started_ms == t[250]


def test_no_user_series_costs_nothing_on_a_fleet_frame() -> None:
    """1,024 GPUs for a minute and no user series: no raw pass, and the detector returns at once."""
    keys = [
        SeriesKey(
            "gpu_memory_temperature_celsius",
            {"cluster": "c", "host": f"n{g // 8}", "gpu": str(g % 8)},
        )
        for g in range(1024)
    ]
    sids = np.tile(np.arange(1024), 60)
    ts = T0 + np.repeat(np.arange(60) * 1000, 1024)
    block = SampleBlock(sids, ts.astype(np.int64), np.full(len(sids), 50.0))
    frame = FrameBuilder(lambda sid: keys[sid]).build(block, T0, T0 + 60_000, 1000)
    assert len(frame.gpus) == 1024 and frame.raw == []
    det = SeriesAnomalies()
    started = time.perf_counter()
    for _ in range(1000):
        assert det.update(frame) == []
    assert (time.perf_counter() - started) / 1000 < 1e-4  # measured: well under a microsecond
    assert "series" not in frame.scores


def test_a_series_anomaly_is_never_a_cause_and_alerts_once_per_series() -> None:
    t, x = T0 + 60_000 * np.arange(300), values(300, spike=200)
    other = {**LABELS, "series": "errors"}
    det = SeriesAnomalies()
    found, _ = det.feed(
        [Series(KEY, LABELS, t, x), Series(SeriesKey("user_series_value", other).text, other, t, x)]
    )
    assert {f.entity["series"] for f in found} == {"queue_depth", "errors"}
    assert all(cause_of(f) == Cause.NONE for f in found)
    labels = [alert_labels(f) for f in found[:2]]
    assert labels[0] != labels[1] and {lab["alertname"] for lab in labels} == {"SeriesAnomaly"}
    frame = frame_of([], T0, T0 + 60_000)
    frame.context, frame.open_findings = Context(), list(found)
    assert RootCause().update(frame) == []  # ranks regressions only, never these


def test_user_series_scores_are_not_exported_as_a_gpus() -> None:
    """A frame with one GPU and one user series: the series' score row is no GPU's."""
    t = T0 + 1000 * np.arange(60)
    frame = frame_of([RawSeries(KEY, LABELS, t, values(60))], T0, T0 + 60_000)
    frame.gpus.add("c/n1/0", {"cluster": "c", "host": "n1", "gpu": "0"})
    SeriesAnomalies().update(frame)
    assert frame.scores["series"].shape == (1, 60)
    assert [v.labels["detector"] for v in snapshot_from_frame(frame).anomaly_score] == []


def test_the_mapped_source_feeds_the_generic_detector(
    store: Store, clock: Clock, tmp_path: Path
) -> None:
    """A mapped page (a fixed series name and one from a page label) through the real
    collector, the store and the detection runner: a finding for the series that spiked."""
    mapping = tmp_path / "map.toml"
    mapping.write_text(
        '[[metric]]\nsource = "app_queue_depth"\nmetric = "user_series_value"\n'
        'static = { series = "queue_depth" }\n\n'
        '[[metric]]\nsource = "app_errors"\nmetric = "user_series_value"\n'
        'labels = { series = "kind" }\n'
    )
    depth, errors = values(120, spike=100), values(120, seed=3)
    at = {"i": 0}

    def page() -> tuple[int, bytes]:
        i = at["i"]
        return 200, (f"app_queue_depth {depth[i]}\n"
                     f'app_errors{{kind="timeouts"}} {errors[i]}\n').encode()  # fmt: skip

    runner = DetectionRunner(store, default_detectors(), settle_seconds=0,
                             backfill_seconds=86_400, context=Context(), clock=clock)  # fmt: skip
    runner.start()
    start_ms = int(clock() * 1000)

    async def run() -> None:
        async with PageServer({"/metrics": page}) as server:
            target = Target(
                "mapped",
                server.url("/metrics"),
                {k: LABELS[k] for k in ("cluster", "rack", "host")},
                60.0,
                5.0,
                mapping=str(mapping),
            )
            engine = engine_for(store, [target], tmp_path, lambda: clock.now)
            async with engine:
                for i in range(120):
                    at["i"] = i
                    clock.now = (start_ms + i * 60_000) / 1000
                    await engine.scrape_round(start_ms + i * 60_000)
                    await engine.sink.flush()
                    if i % 10 == 9:
                        runner.cycle(start_ms + (i + 1) * 60_000)

    asyncio.run(run())
    found = store.findings.query(kind=FindingKind.SERIES_ANOMALY)
    assert [(f.entity, f.started_ms) for f in found] == [(LABELS, start_ms + 100 * 60_000)]
    assert found[0].evidence[0].series == KEY
    (det,) = [d for d in runner.detectors if d.name == "series"]
    assert sorted(det.table.keys) == sorted([KEY, SeriesKey(
        "user_series_value", {**LABELS, "series": "timeouts"}).text])  # fmt: skip
