"""The head (one row per write batch and minute): duplicates, two writers, migration 0006."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import alembic_config, upgrade
from hbmwatch.store.store import Store, open_store
from tests.conftest import NOW, Clock, make_store

T0 = int(NOW * 1000) - 3_600_000  # an hour ago, minute-aligned


def power(host: str = "n1") -> SeriesKey:
    return SeriesKey("gpu_power_watts", {"host": host, "gpu": "0"})


def raw(store: Store, start_ms: int, end_ms: int, host: str = "n1") -> list[tuple[float, float]]:
    selector = parse_selector(f'gpu_power_watts{{host="{host}"}}')
    result = store.range_query(selector, start_ms / 1000, end_ms / 1000, 1)
    return [(p.timestamp, p.value) for s in result.series for p in s.points]


def test_repeats_inside_one_batch_keep_the_first(store: Store) -> None:
    got = store.write([Sample(power(), T0, 1.0), Sample(power(), T0, 2.0)])
    assert (got.accepted, got.duplicates) == (1, 1)
    assert raw(store, T0, T0 + 1) == [(T0 / 1000, 1.0)]


def test_older_samples_are_looked_up_in_their_minute(store: Store) -> None:
    assert store.write([Sample(power(), T0 + 70_000, 3.0)]).accepted == 1
    older = [Sample(power(), T0, 1.0), Sample(power(), T0 + 1000, 2.0)]
    assert store.write(older).accepted == 2  # before the newest written, but new
    again = store.write([*older, Sample(power(), T0 + 70_000, 9.0)])
    assert (again.accepted, again.duplicates) == (0, 3)
    assert [v for _, v in raw(store, T0, T0 + 80_000)] == [1.0, 2.0, 3.0]


def test_two_writers_of_one_series_store_the_first_value_only(store_url: str, clock: Clock) -> None:
    a, b = make_store(store_url, clock), make_store(store_url, clock)
    try:
        # Each has written the series before, so neither looks the other's sample up.
        a.write([Sample(power(), T0 - 2000, 0.0)])
        b.write([Sample(power(), T0 - 1000, 0.5)])
        assert a.write([Sample(power(), T0, 5.0)]).accepted == 1
        assert b.write([Sample(power(), T0, 9.0)]).accepted == 1  # counted, not stored
        assert raw(b, T0, T0 + 1) == [(T0 / 1000, 5.0)]
        latest = b.latest(parse_selector("gpu_power_watts"), 7200)
        assert [(x.timestamp, x.value) for x in latest] == [(T0 / 1000, 5.0)]
        clock.advance(0)
        assert a.compact().samples == 3
        assert raw(a, T0 - 2000, T0 + 1) == [(T0 / 1000 - 2, 0.0), (T0 / 1000 - 1, 0.5),
                                             (T0 / 1000, 5.0)]  # fmt: skip
        minute = a.range_query(
            parse_selector("gpu_power_watts"), T0 / 1000, T0 / 1000 + 60, 60, Aggregation.COUNT
        )
        assert [p.value for p in minute.series[0].points] == [1.0]
    finally:
        a.close()
        b.close()


def test_retention_drops_whole_head_minutes(store: Store, clock: Clock) -> None:
    store.write([Sample(power(), T0 + i * 1000, float(i)) for i in range(90)])
    days = store.settings.raw_retention_days
    report = store.apply_retention(now_ms=T0 + int(days * 86_400_000) + 61_000)
    assert report["head_rows_deleted"] == 60  # the first minute; the second straddles
    assert [v for _, v in raw(store, T0, T0 + 90_000)] == [float(i) for i in range(60, 90)]


def test_migration_0006_moves_the_head_and_back(store_url: str, clock: Clock) -> None:
    engine = create_store_engine(store_url)
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO series (id, metric, key, labels, created_ms) VALUES "
                "(1, 'gpu_power_watts', 'gpu_power_watts{gpu=\"0\",host=\"n1\"}', "
                "'{\"gpu\": \"0\", \"host\": \"n1\"}', 0)"
            ))  # fmt: skip
            conn.execute(
                text("INSERT INTO samples_head (ts, series_id, value) VALUES (:t, 1, :v)"),
                [{"t": T0 + i * 1000, "v": float(i)} for i in range(90)],
            )
        upgrade(engine)
        store = open_store(StoreSettings(url=store_url), clock=clock)
        try:
            assert [v for _, v in raw(store, T0, T0 + 90_000)] == [float(i) for i in range(90)]
            assert store.write([Sample(power(), T0 + 5000, 7.0)]).duplicates == 1
            store.write([Sample(power(), T0 + 90_000, 90.0)])
        finally:
            store.close()
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0005")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT ts, value FROM samples_head ORDER BY ts")).all()
        assert [(int(t), v) for t, v in rows] == [(T0 + i * 1000, float(i)) for i in range(91)]
    finally:
        engine.dispose()


def test_write_rows_refuses_ids_never_resolved(store: Store) -> None:
    first = store.resolve([power("n1")])[power("n1")]
    assert isinstance(first, int)
    got = store.write_rows([(T0, first, 1.0), (T0, first + 1000, 2.0), (T0, -1, 3.0)])
    assert (got.accepted, got.rejected) == (1, {"unknown_series": 2})
    second = store.resolve([power("n2")])[power("n2")]  # the registry grew since
    assert isinstance(second, int)
    assert store.write_rows([(T0, second, 4.0), (T0 + 1000, first, 5.0)]).accepted == 2
