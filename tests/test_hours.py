"""Hour chunks: a store whose closed hours are re-packed answers as one whose are not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from alembic import command
from sqlalchemy import text

from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.promql.engine import evaluate
from hbmwatch.promql.source import StoreSource
from hbmwatch.promql.values import Grid
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store import chunks
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import alembic_config, upgrade
from hbmwatch.store.store import HOUR_MS, MINUTE_MS, Store
from tests.conftest import NOW, Clock, make_store

HOUR0 = int(NOW * 1000) // HOUR_MS * HOUR_MS - 3 * HOUR_MS  # three closed hours, then half
HALF_HOUR = 1800.0  # of the open one (the tests' clock is moved on by this first)
SELECTOR = 'gpu_power_watts{host="n1"}'


def _keys() -> list[SeriesKey]:
    return [SeriesKey("gpu_power_watts", {"host": "n1", "gpu": str(g)}) for g in range(2)]


def _fill(store: Store, end_ms: int) -> int:
    """Every 10 s from HOUR0 to ``end_ms``, gpu 1 skipping minutes 5-9 of each hour."""
    rng = np.random.default_rng(4)
    samples = []
    for g, key in enumerate(_keys()):
        for ts in range(HOUR0 + 3_000, end_ms, 10_000):
            if g == 1 and 5 <= (ts % HOUR_MS) // MINUTE_MS < 10:
                continue
            samples.append(Sample(key, ts, round(float(300 + rng.normal(0, 20)), 1)))
    return store.write(samples).accepted


def _answers(store: Store, clock: Clock) -> dict[str, Any]:
    """Every kind of read over the closed hours and the open one."""
    sel = parse_selector(SELECTOR)
    lo, hi = HOUR0 / 1000, clock.now

    def flat(result: Any) -> list:
        return sorted(
            (s.series.text, [(p.timestamp, p.value) for p in s.points]) for s in result.series
        )

    out: dict[str, Any] = {"raw": flat(store.range_query(sel, lo, hi, 10))}
    for agg in (Aggregation.AVG, Aggregation.MAX, Aggregation.COUNT, Aggregation.LAST):
        out[f"1m {agg}"] = flat(store.range_query(sel, lo, hi, 60, agg))
        out[f"1h {agg}"] = flat(store.range_query(sel, lo, hi, 3600, agg))
    out["rate"] = flat(store.counter_query(parse_selector("gpu_energy_joules_total"), lo, hi, 60))
    out["latest"] = sorted((v.series.text, v.timestamp, v.value) for v in store.latest(sel))
    for tier in ("raw", "1m", "1h"):
        got, expired = store.select_samples(
            [m for m in _matchers()], HOUR0, int(clock.now * 1000), tier
        )
        rows = sorted(
            (k.text, t.tolist(), v.tolist(), None if s is None else s.max.tolist())
            for k, t, v, s in got
        )
        out[f"select {tier}"] = (rows, expired)
    out["labels"] = sorted(k.text for k in store.label_sets(_matchers(), HOUR0, HOUR0 + 600_000))
    grid = Grid(HOUR0 + 600_000, int(clock.now * 1000), 300_000)
    for tier in ("raw", "1m"):
        for q in (
            f"max_over_time({SELECTOR}[10m])",
            f"avg_over_time({SELECTOR}[1h])",
            f"sum by (host) ({SELECTOR})",
        ):
            value = evaluate(q, grid, StoreSource(store, tier))
            out[f"promql {tier} {q}"] = sorted(
                (r.labels, np.where(r.present, r.values, -1).tolist()) for r in value
            )
    return out


def _matchers() -> list[Matcher]:
    return [Matcher("__name__", MatchOp.EQ, "gpu_power_watts", None), Matcher.of("host", "=", "n1")]


def _table_rows(store: Store, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _hour_partitions(store: Store) -> int | None:
    """PostgreSQL's day partitions of ``samples_hour`` (None on SQLite)."""
    if store.backend.name != "postgresql":
        return None
    with store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST('samples_hour' AS regclass) "
            "AND c.relname LIKE 'samples_hour_p%'"
        )).scalar_one())  # fmt: skip


@pytest.fixture
def filled(store_url: str, clock: Clock) -> Store:
    clock.advance(HALF_HOUR)
    store = make_store(store_url, clock)
    _fill(store, int(clock.now * 1000) - 90_000)
    energy = SeriesKey("gpu_energy_joules_total", {"host": "n1", "gpu": "0"})
    store.write(
        Sample(energy, ts, float(ts - HOUR0) / 7)
        for ts in range(HOUR0, int(clock.now * 1000) - 90_000, 15_000)
    )
    store.compact(hours=False)
    return store


def test_repacked_hours_answer_as_minute_chunks(filled: Store, clock: Clock) -> None:
    store = filled
    try:
        before = _answers(store, clock)
        assert all(before.values()) and len(before["raw"][0][1]) > 3 * 360
        minute_rows = _table_rows(store, "samples_chunk")
        assert _hour_partitions(store) in (None, 0)  # none made ahead: a young store's
        report = store.compact()
        assert report.hours == 3 * 3  # three closed hours of three series
        assert _hour_partitions(store) in (None, 1, 2)  # the days of those hours
        assert _table_rows(store, "samples_hour") == 9
        assert _table_rows(store, "samples_chunk") < minute_rows / 3  # the open hour's
        assert _answers(store, clock) == before
    finally:
        store.close()


def test_late_samples_merge_into_a_repacked_hour(filled: Store, clock: Clock) -> None:
    store = filled
    key = _keys()[0]
    minute = HOUR0 + 20 * MINUTE_MS
    try:
        store.compact()
        sel = parse_selector('gpu_power_watts{gpu="0"}')
        before = store.range_query(sel, minute / 1000, minute / 1000 + 60, 60, Aggregation.COUNT)
        hour_before = store.range_query(sel, HOUR0 / 1000, HOUR0 / 1000 + 3600, 3600,
                                        Aggregation.COUNT)  # fmt: skip
        late = [Sample(key, minute + 1_000, 999.0), Sample(key, minute + 3_000, -5.0)]
        result = store.write(late)
        assert (result.accepted, result.duplicates) == (1, 1)  # minute + 3 s is stored
        store.compact()
        raw = store.range_query(sel, minute / 1000, minute / 1000 + 60, 1)
        stamps = {p.timestamp: p.value for p in raw.series[0].points}
        assert stamps[(minute + 1_000) / 1000] == 999.0
        assert stamps[(minute + 3_000) / 1000] != -5.0  # the stored value wins
        after = store.range_query(sel, minute / 1000, minute / 1000 + 60, 60, Aggregation.COUNT)
        assert after.series[0].points[0].value == before.series[0].points[0].value + 1
        top = store.range_query(sel, minute / 1000, minute / 1000 + 60, 60, Aggregation.MAX)
        assert top.series[0].points[0].value == 999.0
        hour = store.range_query(sel, HOUR0 / 1000, HOUR0 / 1000 + 3600, 3600, Aggregation.COUNT)
        assert hour.series[0].points[0].value == hour_before.series[0].points[0].value + 1
        assert store.write(late[:1]).duplicates == 1  # a retry is found in the hour chunk
        assert _table_rows(store, "samples_chunk") < 100  # merged, not a new minute row
    finally:
        store.close()


def test_existing_minute_chunks_are_repacked_after_migration(store_url: str, clock: Clock) -> None:
    clock.advance(HALF_HOUR)
    store = make_store(store_url, clock)
    _fill(store, int(clock.now * 1000) - 90_000)
    store.compact(hours=False)
    before = _answers(store, clock)
    store.close()
    engine = create_store_engine(store_url)
    try:
        config = alembic_config()
        with engine.begin() as conn:  # back to a store before hour chunks, minute rows kept
            config.attributes["connection"] = conn
            command.downgrade(config, "0006")
        upgrade(engine)
    finally:
        engine.dispose()
    store = make_store(store_url, clock)
    try:
        assert store.repack_hours(max_hours=1) == 2  # a backlog clears a few hours a pass
        assert store.compact().hours == 4
        assert _answers(store, clock) == before
    finally:
        store.close()


def test_minute_statistics_pack_and_unpack() -> None:
    hour = 7 * HOUR_MS
    index = np.array([0, 1, 2, 30, 59])
    start = hour + index * MINUTE_MS
    stats = chunks.MinuteStats(
        start, np.array([60, 60, 12, 1, 60]), np.array([1.5, 2.0, -3.25, 4.0, 0.0]),
        np.array([9.5, 2.0, 3.0, 4.0, 1e300]), np.array([100.1, 120.0, 0.3, 4.0, 1e300]),
        np.array([2.0, 2.0, 1.0, 4.0, 7.0]), start + np.array([59_000, 59_999, 11_000, 0, 1]),
    )  # fmt: skip
    (blob,) = chunks.pack_minutes([hour], [stats])
    back = chunks.unpack_minutes(blob, hour)
    for field in chunks.MinuteStats.__slots__:
        assert np.array_equal(getattr(back, field), getattr(stats, field)), field
    with pytest.raises(chunks.codec.CorruptChunk):
        chunks.unpack_minutes(b"\x09" + blob[1:], hour)
