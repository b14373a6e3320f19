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
from hbmwatch.store import chunks, codec
from hbmwatch.store.backend import DAY_MS, partition_name
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import alembic_config, upgrade
from hbmwatch.store.store import HOUR_MS, MINUTE_MS, Store
from tests.conftest import NOW, Clock, make_store

HOUR0 = int(NOW * 1000) // HOUR_MS * HOUR_MS - 3 * HOUR_MS  # three closed hours, then half
HALF_HOUR = 1800.0  # of the open one (the tests' clock is moved on by this first)
SELECTOR = 'gpu_power_watts{host="n1"}'


def _keys() -> list[SeriesKey]:
    return [SeriesKey("gpu_power_watts", {"host": "n1", "gpu": str(g)}) for g in range(2)]


def _fill(store: Store, end_ms: int, start: int = HOUR0) -> int:
    """Every 10 s from ``start`` to ``end_ms``, gpu 1 skipping minutes 5-9 of each hour."""
    rng = np.random.default_rng(4)
    samples = []
    for g, key in enumerate(_keys()):
        for ts in range(start + 3_000, end_ms, 10_000):
            if g == 1 and 5 <= (ts % HOUR_MS) // MINUTE_MS < 10:
                continue
            samples.append(Sample(key, ts, round(float(300 + rng.normal(0, 20)), 1)))
    return store.write(samples).accepted


def _answers(store: Store, clock: Clock, start: int = HOUR0) -> dict[str, Any]:
    """Every kind of read over the closed hours (from ``start``) and the open one."""
    sel = parse_selector(SELECTOR)
    lo, hi = start / 1000, clock.now

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
            [m for m in _matchers()], start, int(clock.now * 1000), tier
        )
        rows = sorted(
            (k.text, t.tolist(), v.tolist(), None if s is None else s.max.tolist())
            for k, t, v, s in got
        )
        out[f"select {tier}"] = (rows, expired)
    out["labels"] = sorted(k.text for k in store.label_sets(_matchers(), start, start + 600_000))
    grid = Grid(start + 600_000, int(clock.now * 1000), 300_000)
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
        return _table_rows_of(conn, table)


def _table_rows_of(conn: Any, table: str) -> int:
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


def _chunk_rows(conn: Any) -> dict[tuple[int, int], tuple]:
    """``samples_chunk`` by (series, minute): count, min, max, sum, last, last_ms, and the
    decoded samples (None: expired)."""
    out = {}
    for sid, start, *stats, data in conn.execute(text(
        "SELECT series_id, start_ms, count, min, max, sum, last, last_ms, data FROM samples_chunk"
    )):  # fmt: skip
        samples = None if data is None else [a.tolist() for a in codec.decode(bytes(data), start)]
        out[(int(sid), int(start))] = (*stats, samples)
    return out


def _held_by_hours(conn: Any) -> dict[tuple[int, int], tuple]:
    """What ``samples_hour`` holds, minute by minute, as ``_chunk_rows`` reads minute rows."""
    out = {}
    for sid, hour, minutes, data in conn.execute(
        text("SELECT series_id, start_ms, minutes, data FROM samples_hour")
    ):
        assert minutes is not None  # an hour with expired statistics is made in the test
        ts, values = (None, None) if data is None else codec.decode(bytes(data), hour)
        st = chunks.unpack_minutes(bytes(minutes), hour)
        for i, start in enumerate(st.start_ms.tolist()):
            samples = None
            if ts is not None:
                pick = (ts >= start) & (ts < start + MINUTE_MS)
                samples = [ts[pick].tolist(), values[pick].tolist()]
            floats = (float(getattr(st, f)[i]) for f in ("min", "max", "sum", "last"))
            out[(int(sid), start)] = (int(st.count[i]), *floats, int(st.last_ms[i]), samples)
    return out


def test_downgrade_turns_hour_rows_back_into_minute_rows(store_url: str) -> None:
    """0007's downgrade puts every hour row back as the minute rows the hour pass deleted:
    dropping ``samples_hour`` alone lost every closed hour's raw samples and statistics."""
    clock = Clock(NOW - 5 * 3600 + HALF_HOUR)  # 03:30; the first closed hour: 23:00 the day before
    start = int(clock.now * 1000) // HOUR_MS * HOUR_MS - 4 * HOUR_MS
    store = make_store(store_url, clock)
    try:
        _fill(store, int(clock.now * 1000) - 90_000, start)
        while store.compact().hours:
            pass
        newcomer = SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "2"})
        late = [
            Sample(_keys()[0], start + HOUR_MS + 20 * MINUTE_MS + 1_000, 999.0),  # into an hour row
            Sample(newcomer, start + 2 * HOUR_MS + 7 * MINUTE_MS, 5.0),  # a minute row of its own
        ]
        assert store.write(late).accepted == 2
        while store.compact().hours:
            pass
        expired = store.apply_retention(now_ms=start + HOUR_MS + 7 * DAY_MS)
        assert expired["raw_hours_expired"] == 2  # the first hour's raw samples, both series
        before = _answers(store, clock, start)
        with store.engine.begin() as conn:
            expected = _chunk_rows(conn) | _held_by_hours(conn)
            # A store whose 1-minute tier is kept shorter than raw samples: statistics gone,
            # samples kept.  The downgrade rebuilds the statistics (recorded above) from them.
            conn.execute(text(
                "UPDATE samples_hour SET minutes = NULL WHERE start_ms = :hour AND series_id = "
                "(SELECT id FROM series WHERE key = :key)"
            ), {"hour": start + 2 * HOUR_MS, "key": _keys()[1].text})  # fmt: skip
        assert any(row[6] is None for row in expected.values())
    finally:
        store.close()
    engine = create_store_engine(store_url)
    try:
        with engine.begin() as conn:
            assert _table_rows_of(conn, "samples_hour") == 2 * 4  # the newcomer's is a minute row
            if engine.dialect.name == "postgresql":  # as retention drops a day of no minute rows
                assert _table_rows_of(conn, partition_name(start)) == 0
                conn.execute(text(f"DROP TABLE {partition_name(start)}"))
            config = alembic_config()
            config.attributes["connection"] = conn
            command.downgrade(config, "0006")
        with engine.connect() as conn:
            assert _chunk_rows(conn) == expected
            state = "SELECT count(*) FROM store_state WHERE name = 'hours_packed_until_ms'"
            assert conn.execute(text(state)).scalar_one() == 0
            if engine.dialect.name == "postgresql":
                assert _table_rows_of(conn, "samples_chunk_default") == 0
                assert _table_rows_of(conn, partition_name(start)) > 0
        upgrade(engine)
    finally:
        engine.dispose()
    store = make_store(store_url, clock)
    try:
        while store.compact().hours:
            pass
        assert _answers(store, clock, start) == before
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
