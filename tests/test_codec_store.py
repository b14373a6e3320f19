"""A store holding version 1 (zlib) chunks, as written before pcodec, keeps working."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store import codec
from hbmwatch.store.store import Store
from tests.conftest import NOW

T0 = int(NOW * 1000) - 3_600_000  # an hour ago, minute-aligned
KEY = SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "0"})


def _rewrite_as_version_1(store: Store) -> int:
    """Re-encode every stored chunk with the old codec, as an older release left them."""
    with store.engine.begin() as conn:
        rows = conn.execute(text("SELECT series_id, start_ms, data FROM samples_chunk")).all()
        for sid, start, blob in rows:
            assert bytes(blob)[0] == codec.VERSION_PCO  # compaction writes version 2
            ts, values = codec.decode(bytes(blob), int(start))
            conn.execute(
                text("UPDATE samples_chunk SET data = :d WHERE series_id = :s AND start_ms = :t"),
                {"d": codec.encode(int(start), ts, values, codec.VERSION), "s": sid, "t": start},
            )
    return len(rows)


def _raw(store: Store, start_ms: int, end_ms: int) -> list[tuple[float, float]]:
    result = store.range_query(
        parse_selector("gpu_power_watts"), start_ms / 1000, end_ms / 1000, 0.5, Aggregation.AVG
    )
    return [(p.timestamp, p.value) for p in result.series[0].points]


def test_version_1_chunks_read_merge_and_expire(store: Store) -> None:
    values = np.round(550 + np.cumsum(np.random.default_rng(3).normal(0, 8, 180)), 3)
    store.write([Sample(KEY, T0 + i * 1000, float(v)) for i, v in enumerate(values)])
    store.compact()
    assert _rewrite_as_version_1(store) == 3
    expected = [(T0 / 1000 + i, float(v)) for i, v in enumerate(values)]
    assert _raw(store, T0, T0 + 180_000) == expected

    late = store.write([Sample(KEY, T0 + 61_500, 1.0), Sample(KEY, T0 + 62_000, 2.0)])
    assert (late.accepted, late.duplicates) == (1, 1)  # +62 s is in the old chunk
    assert store.compact().merged == 1
    got = _raw(store, T0 + 60_000, T0 + 63_000)
    assert got == [(T0 / 1000 + 60, expected[60][1]), (T0 / 1000 + 61, expected[61][1]),
                   (T0 / 1000 + 61.5, 1.0), (T0 / 1000 + 62, expected[62][1])]  # fmt: skip
    with store.engine.connect() as conn:
        kinds = conn.execute(text("SELECT start_ms, data FROM samples_chunk ORDER BY 1")).all()
    assert [bytes(blob)[0] for _, blob in kinds] == [1, 2, 1]  # the merged minute is rewritten
    minute = store.range_query(
        parse_selector("gpu_power_watts"), T0 / 1000, T0 / 1000 + 180, 60, Aggregation.COUNT
    )
    assert [p.value for p in minute.series[0].points] == [60, 61, 60]
