"""The store on both backends: writes, bad input, tiers, queries, retention, inventory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Device, Sample, SeriesKey
from hbmwatch.store.store import Store
from hbmwatch.validation import InvalidQuery
from tests.conftest import NOW, Clock, make_store

T0 = int(NOW * 1000) - 3_600_000  # an hour ago, minute-aligned


def power(host: str = "n1", gpu: str = "0", **extra: str) -> SeriesKey:
    return SeriesKey("gpu_power_watts", {"host": host, "gpu": gpu, **extra})


def temps(key: SeriesKey, start_ms: int, values: list[float], step_ms: int = 1000) -> list[Sample]:
    return [Sample(key, start_ms + i * step_ms, v) for i, v in enumerate(values)]


def points(
    store: Store,
    selector: str,
    start: float,
    end: float,
    step: float,
    agg: Aggregation = Aggregation.AVG,
    q: float | None = None,
) -> list[tuple[float, float]]:
    result = store.range_query(parse_selector(selector), start, end, step, agg, q)
    assert len(result.series) == 1
    return [(p.timestamp, p.value) for p in result.series[0].points]


def test_write_and_read_back_raw(store: Store) -> None:
    key = power()
    values = [100.0 + i % 7 + 0.125 for i in range(120)]
    result = store.write(temps(key, T0, values))
    assert (result.received, result.accepted, result.duplicates) == (120, 120, 0)
    got = points(store, 'gpu_power_watts{host="n1"}', T0 / 1000, T0 / 1000 + 120, 1)
    assert [v for _, v in got] == values
    assert got[0][0] == T0 / 1000


def test_retried_write_never_duplicates(store: Store, clock: Clock) -> None:
    batch = temps(power(), T0, [1.0, 2.0, 3.0])
    assert store.write(batch).accepted == 3
    again = store.write(batch)
    assert (again.accepted, again.duplicates) == (0, 3)
    clock.advance(0)
    store.compact()
    assert store.write(batch).duplicates == 3  # compacted minutes dedupe too
    store.compact()
    got = points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 60, 60, Aggregation.COUNT)
    assert got == [(T0 / 1000, 3.0)]


def test_first_value_wins_on_conflicting_duplicate(store: Store) -> None:
    store.write([Sample(power(), T0, 5.0)])
    assert store.write([Sample(power(), T0, 9.0)]).duplicates == 1
    assert points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 1, 1) == [(T0 / 1000, 5.0)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_rejected_and_counted(store: Store, bad: float) -> None:
    result = store.write([Sample(power(), T0, bad), Sample(power(), T0 + 1000, 7.0)])
    assert result.rejected == {"non_finite": 1}
    assert result.accepted == 1
    assert "non_finite" in result.errors[0]
    metric = store.metrics.rejected.labels("non_finite")._value.get()
    assert metric == 1


def test_clock_skew_bound(store: Store) -> None:
    ahead = int(NOW * 1000) + 301_000
    ok = int(NOW * 1000) + 299_000
    result = store.write([Sample(power(), ahead, 1.0), Sample(power(), ok, 1.0)])
    assert result.rejected == {"future": 1} and result.accepted == 1
    assert "clock-skew" in result.errors[0]


def test_older_than_retention_rejected(store: Store) -> None:
    old = int(NOW * 1000) - 8 * 86_400_000
    assert store.write([Sample(power(), old, 1.0)]).rejected == {"too_old": 1}


def test_negative_counter_rejected(store: Store) -> None:
    key = SeriesKey("gpu_energy_joules_total", {"host": "n1", "gpu": "0"})
    result = store.write([Sample(key, T0, -5.0), Sample(key, T0 + 1000, 5.0)])
    assert result.rejected == {"negative_counter": 1}
    # a negative gauge is fine (a temperature below zero is possible)
    assert store.write([Sample(power(), T0, -1.0)]).accepted == 1


def test_unknown_metric_and_bad_labels_rejected_with_reasons(store: Store) -> None:
    result = store.write(
        [
            Sample(SeriesKey("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}), T0, 40.0),
            Sample(SeriesKey("gpu_power_watts", {"host": "n1"}), T0, 40.0),  # no gpu
            Sample(SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "0", "color": "x"}), T0, 1),
            Sample(
                SeriesKey("gpu_clock_hertz", {"host": "n1", "gpu": "0", "domain": "warp"}), T0, 1.0
            ),
            Sample(power(), T0, 40.0),
        ]
    )
    assert result.rejected == {"unknown_metric": 1, "invalid_labels": 3}
    assert result.accepted == 1
    text = "\n".join(result.errors)
    assert "DCGM_FI_DEV_GPU_TEMP" in text and "needs label(s) gpu" in text
    assert "'color'" in text and "warp" in text


def test_cardinality_cap_rejects_new_series_only(store_url: str, clock: Clock) -> None:
    store = make_store(store_url, clock, max_series_per_metric=3)
    try:
        first = [Sample(power(gpu=str(g)), T0, 1.0) for g in range(3)]
        assert store.write(first).accepted == 3
        result = store.write([Sample(power(gpu=str(g)), T0 + 1000, 1.0) for g in range(5)])
        assert result.accepted == 3
        assert result.rejected == {"cardinality": 2}
        assert "cap" in result.errors[0]
    finally:
        store.close()


def test_workload_label_explosion_capped(store_url: str, clock: Clock) -> None:
    store = make_store(store_url, clock, max_values_per_workload_label=2)
    try:

        def lat(pod: str) -> Sample:
            return Sample(
                SeriesKey(
                    "workload_window_requests", {"service": "chat", "phase": "e2e", "pod": pod}
                ),
                T0,
                1.0,
            )

        result = store.write([lat(f"pod-{i}") for i in range(5)])
        assert result.accepted == 2 and result.rejected == {"cardinality": 3}
        assert "label explosion" in result.errors[0]
    finally:
        store.close()


def test_out_of_order_and_late_samples_merge_after_compaction(store: Store) -> None:
    key = power()
    store.write(temps(key, T0 + 10_000, [10.0, 11.0, 12.0]))
    store.write([Sample(key, T0 + 5_000, 5.0)])  # out of order, same minute
    report = store.compact()
    assert report.chunks == 1 and report.merged == 0
    late = store.write([Sample(key, T0 + 1_000, 1.0), Sample(key, T0 + 10_000, 99.0)])
    assert (late.accepted, late.duplicates) == (1, 1)  # +10 s is already in the chunk
    report = store.compact()
    assert report.merged == 1
    got = points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 60, 1)
    assert got == [
        (T0 / 1000 + 1, 1.0),
        (T0 / 1000 + 5, 5.0),
        (T0 / 1000 + 10, 10.0),
        (T0 / 1000 + 11, 11.0),
        (T0 / 1000 + 12, 12.0),
    ]
    stats = {
        agg: points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 60, 60, agg)[0][1]
        for agg in (Aggregation.COUNT, Aggregation.MIN, Aggregation.MAX, Aggregation.SUM)
    }
    assert stats == {
        Aggregation.COUNT: 5,
        Aggregation.MIN: 1,
        Aggregation.MAX: 12,
        Aggregation.SUM: 39,
    }
    hour = points(store, "gpu_power_watts", T0 / 1000 - 3600, NOW, 3600, Aggregation.COUNT)
    assert sum(v for _, v in hour) == 5


def test_a_write_landing_while_its_minute_is_encoded_is_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction encodes a minute without the write lock; a sample written into that
    minute meanwhile (a late one) makes it encode the minute again, under the lock."""
    key = power()
    store.write(temps(key, T0, [1.0, 2.0, 3.0]))
    prepare = store._prepare_minute
    calls = []

    def racing(conn, lo, watermark):  # type: ignore[no-untyped-def]
        prepared = prepare(conn, lo, watermark)
        if not calls:  # the first, unlocked pass: a collector writes into the minute now
            assert store.write([Sample(key, T0 + 30_000, 30.0)]).accepted == 1
        calls.append(prepared.samples)
        return prepared

    monkeypatch.setattr(store, "_prepare_minute", racing)
    report = store.compact()
    assert calls == [3, 4] and report.samples == 4
    got = points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 60, 1)
    assert [v for _, v in got] == [1.0, 2.0, 3.0, 30.0]


def test_rollup_tiers_match_raw_arithmetic(store: Store, clock: Clock) -> None:
    rng = np.random.default_rng(7)
    key = power()
    values = np.round(rng.normal(300, 20, 3 * 3600), 3)
    start = int(NOW * 1000) - 4 * 3_600_000
    for i in range(0, len(values), 1800):
        store.write(temps(key, start + i * 1000, values[i : i + 1800].tolist()))
    store.compact()
    s, e = start / 1000, start / 1000 + 3 * 3600
    for agg, fn in (
        (Aggregation.AVG, np.mean),
        (Aggregation.MIN, np.min),
        (Aggregation.MAX, np.max),
        (Aggregation.SUM, np.sum),
        (Aggregation.LAST, lambda a: a[-1]),
        (Aggregation.COUNT, len),
    ):
        minute = store.range_query(parse_selector("gpu_power_watts"), s, e, 300, agg)
        assert minute.tier == "1m"
        expected = [fn(values[i : i + 300]) for i in range(0, len(values), 300)]
        assert [p.value for p in minute.series[0].points] == pytest.approx(expected)
        hourly = store.range_query(parse_selector("gpu_power_watts"), s, e, 3600, agg)
        assert hourly.tier == "1h"
        expected = [fn(values[i : i + 3600]) for i in range(0, len(values), 3600)]
        assert [p.value for p in hourly.series[0].points] == pytest.approx(expected)
    raw = store.range_query(
        parse_selector("gpu_power_watts"), s, e, 3600, Aggregation.QUANTILE, 0.99
    )
    assert raw.tier == "raw"
    assert raw.series[0].points[0].value == pytest.approx(np.quantile(values[:3600], 0.99))


def test_minute_query_spans_compacted_and_head(store: Store) -> None:
    key = power()
    start = int(NOW * 1000) - 300_000
    store.write(temps(key, start, [1.0] * 300))
    store.compact()  # the last 90 s stay in the head (compaction grace)
    assert store.watermark_ms() < int(NOW * 1000)
    got = points(store, "gpu_power_watts", start / 1000, NOW, 60, Aggregation.COUNT)
    assert [v for _, v in got] == [60.0] * 5


def test_rate_and_increase_across_reset_and_32bit_wrap(store: Store) -> None:
    key = SeriesKey("gpu_pcie_bytes_total", {"host": "n1", "gpu": "0", "direction": "rx"})
    # NVML's PCIe counter: +50 MB a second, wrapping at 2**32, then a driver reload (reset).
    values, v = [], 2**32 - 120_000_000
    for i in range(180):
        if i == 120:
            v = 0
        values.append(float(v))
        v = (v + 50_000_000) % 2**32
    store.write(temps(key, T0, values))
    store.compact()
    inc = store.counter_query(
        parse_selector("gpu_pcie_bytes_total"), T0 / 1000, T0 / 1000 + 180, 60, "increase"
    )
    got = [p.value for p in inc.series[0].points]
    assert got == [59 * 50e6, 60 * 50e6, 59 * 50e6]  # the reset loses one interval, not more
    rate = store.counter_query(
        parse_selector("gpu_pcie_bytes_total"), T0 / 1000, T0 / 1000 + 180, 60, "rate"
    )
    assert rate.series[0].points[1].value == pytest.approx(50e6)
    with pytest.raises(InvalidQuery, match="not a counter"):
        store.counter_query(parse_selector("gpu_power_watts"), T0 / 1000, NOW, 60)


def test_label_matchers(store: Store) -> None:
    for host in ("n1", "n2", "m3"):
        for gpu in ("0", "1"):
            store.write([Sample(power(host, gpu), T0, 1.0)])

    def hosts(selector: str) -> set[tuple[str, str]]:
        return {(k.label("host"), k.label("gpu")) for k in store.series(parse_selector(selector))}

    assert hosts('gpu_power_watts{host="n1"}') == {("n1", "0"), ("n1", "1")}
    assert hosts('gpu_power_watts{host!="n1",gpu="1"}') == {("n2", "1"), ("m3", "1")}
    assert hosts('gpu_power_watts{host=~"n.*"}') == {
        ("n1", "0"),
        ("n1", "1"),
        ("n2", "0"),
        ("n2", "1"),
    }
    assert hosts('gpu_power_watts{host!~"n.*",gpu="0"}') == {("m3", "0")}
    assert hosts('gpu_power_watts{host=~"n"}') == set()  # anchored, as in Prometheus
    assert len(store.series(parse_selector("gpu_power_watts"), limit=2)) == 2


def test_latest_and_staleness(store: Store, clock: Clock) -> None:
    store.write(
        [
            Sample(power("n1"), int(NOW * 1000) - 10_000, 7.0),
            Sample(power("n2"), int(NOW * 1000) - 900_000, 8.0),
        ]
    )
    store.compact()
    latest = store.latest(parse_selector("gpu_power_watts"), lookback=300)
    assert [(v.series.label("host"), v.value, v.timestamp) for v in latest] == [
        ("n1", 7.0, NOW - 10)
    ]
    clock.advance(600)
    store.compact()
    assert store.latest(parse_selector("gpu_power_watts"), lookback=300) == []
    older = store.latest(parse_selector("gpu_power_watts"), lookback=3600)
    assert {v.series.label("host") for v in older} == {"n1", "n2"}


def test_query_parameter_errors(store: Store) -> None:
    store.write([Sample(power(), T0, 1.0)])
    sel = parse_selector("gpu_power_watts")
    with pytest.raises(InvalidQuery, match="step must be positive"):
        store.range_query(sel, 0, 10, 0)
    with pytest.raises(InvalidQuery, match="must be after start"):
        store.range_query(sel, 10, 5, 1)
    with pytest.raises(InvalidQuery, match="over the limit"):
        store.range_query(sel, 0, 86_400 * 30, 1)
    with pytest.raises(InvalidQuery, match="finite"):
        store.range_query(sel, math.nan, 5, 1)
    with pytest.raises(InvalidQuery, match="quantile"):
        store.range_query(sel, 0, 10, 1, Aggregation.QUANTILE)


def test_series_per_query_limit(store_url: str, clock: Clock) -> None:
    store = make_store(store_url, clock, max_series_per_query=2)
    try:
        store.write([Sample(power(gpu=str(g)), T0, 1.0) for g in range(3)])
        with pytest.raises(InvalidQuery, match="matches 3 series"):
            store.range_query(parse_selector("gpu_power_watts"), T0 / 1000, NOW, 60)
    finally:
        store.close()


def test_retention_per_tier(store_url: str, clock: Clock) -> None:
    store = make_store(
        store_url,
        clock,
        raw_retention_days=1,
        rollup_1m_retention_days=2,
        rollup_1h_retention_days=3,
    )
    try:
        key = power()
        start = int(NOW * 1000) - 3_600_000
        store.write(temps(key, start, [5.0] * 120))
        store.compact()
        clock.advance(1.5 * 86_400)  # raw expired, minute and hour tiers kept
        store.compact()  # as the maintenance loop does: the hour is complete now
        expired = store.apply_retention()
        # The two minutes were re-packed into their hour's chunk by the second compaction.
        assert (expired["raw_chunks_expired"], expired["raw_hours_expired"]) == (0, 1)
        s = start / 1000
        assert points(store, "gpu_power_watts", s, s + 120, 60, Aggregation.COUNT) == [
            (s, 60.0),
            (s + 60, 60.0),
        ]
        raw = store.range_query(parse_selector("gpu_power_watts"), s, s + 120, 1)
        assert raw.series == [] and "retention" in raw.warnings[0]
        clock.advance(86_400)  # minute tier gone, hour tier kept
        store.apply_retention()
        assert (
            store.range_query(
                parse_selector("gpu_power_watts"), s, s + 120, 60, Aggregation.COUNT
            ).series
            == []
        )
        hour = points(store, "gpu_power_watts", s - 3600, s + 3600, 3600, Aggregation.COUNT)
        assert sum(v for _, v in hour) == 120
        clock.advance(86_400)
        store.apply_retention()
        assert (
            store.range_query(
                parse_selector("gpu_power_watts"), s - 3600, s + 3600, 3600, Aggregation.COUNT
            ).series
            == []
        )
    finally:
        store.close()


def test_restart_keeps_series_watermark_and_data(store_url: str, clock: Clock) -> None:
    first = make_store(store_url, clock)
    first.write(temps(power(), T0, [3.0] * 90))
    first.compact()
    watermark = first.watermark_ms()
    first.close()
    second = make_store(store_url, clock)
    try:
        assert second.watermark_ms() == watermark > T0
        assert second.write(temps(power(), T0, [3.0] * 90)).duplicates == 90
        assert second.series_registry.id_of(power()) == 1
        got = points(second, "gpu_power_watts", T0 / 1000, T0 / 1000 + 120, 60, Aggregation.COUNT)
        assert got == [(T0 / 1000, 60.0), (T0 / 1000 + 60, 30.0)]
    finally:
        second.close()


def test_two_processes_share_the_registry(store_url: str, clock: Clock) -> None:
    a, b = make_store(store_url, clock), make_store(store_url, clock)
    try:
        a.write([Sample(power("n1"), T0, 1.0)])
        b.write([Sample(power("n1"), T0 + 1000, 2.0), Sample(power("n2"), T0, 3.0)])
        assert a.series_registry.id_of(power("n1")) == b.series_registry.id_of(power("n1"))
        assert len(a.series(parse_selector("gpu_power_watts"))) == 2
    finally:
        a.close()
        b.close()


def test_inventory_upsert_and_filter(store: Store, clock: Clock) -> None:
    devices = [
        Device(
            host=f"n{i // 8}",
            gpu=str(i % 8),
            cluster="c",
            rack=f"r{i // 16}",
            sku="MI300X",
            vendor="amd",
            compute_partition="spx",
            memory_partition="nps1",
        )
        for i in range(32)
    ]
    assert store.upsert_devices(devices) == 32
    clock.advance(60)
    store.upsert_devices(
        [
            Device(
                host="n0",
                gpu="0",
                cluster="c",
                rack="r0",
                sku="MI300X",
                vendor="amd",
                driver="6.14.14",
            )
        ]
    )
    assert len(store.devices()) == 32
    assert len(store.devices(rack="r1")) == 16
    assert store.devices(host="n0", gpu="0")[0].driver == "6.14.14"
    with pytest.raises(InvalidQuery, match="cannot be filtered"):
        store.devices(colour="red")


def test_resolve_then_write_rows(store: Store) -> None:
    outcome = store.resolve([power("n1"), SeriesKey("not_canonical", {})])
    sid = outcome[power("n1")]
    assert isinstance(sid, int)
    assert "unknown metric" in str(outcome[SeriesKey("not_canonical", {})])
    result = store.write_rows(
        [(T0, sid, 1.0), (T0 + 1000, 999_999, 2.0), (T0 + 2000, sid, math.nan)]
    )
    assert (result.accepted, result.rejected) == (1, {"unknown_series": 1, "non_finite": 1})
    assert points(store, "gpu_power_watts", T0 / 1000, T0 / 1000 + 5, 1) == [(T0 / 1000, 1.0)]
