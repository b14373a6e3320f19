"""How samples sit at rest, shared by the write path, compaction and the queries.

Samples land in the head, closed minutes move into per-series minute chunks and fold into
hourly rollups; the compaction watermark says up to where the chunks are complete.  Series
ids are sent to the database in bounded ``IN (...)`` lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import delete, select

from hbmwatch.store.models import StoreState

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
#: series ids per ``IN (...)`` list, well under SQLite's bound-parameter and statement limits
IN_BATCH = 900
#: the store_state row holding the compaction watermark (epoch ms)
WATERMARK = "compacted_until_ms"


def floor(ms: int, width: int) -> int:
    """``ms`` rounded down to a multiple of ``width`` (a minute, an hour, a day, a step)."""
    return ms - ms % width


def batches(ids: Sequence[int]) -> Iterable[list[int]]:
    """``ids`` in lists of at most ``IN_BATCH``."""
    ids = list(ids)
    for i in range(0, len(ids), IN_BATCH):
        yield ids[i : i + IN_BATCH]


def in_list(ids: Sequence[int]) -> str:
    """Integer ids as SQL list text; ``int`` makes the interpolation safe."""
    return ",".join(str(int(i)) for i in ids)


def read_watermark(conn: Any) -> int:
    """Minutes before this instant are compacted into chunks (0 before the first pass)."""
    value = conn.execute(select(StoreState.value).where(StoreState.name == WATERMARK)).scalar()
    return int(value) if value is not None else 0


def write_state(conn: Any, name: str, value: Any) -> None:
    """Set one ``store_state`` row, in the caller's transaction."""
    conn.execute(delete(StoreState).where(StoreState.name == name))
    conn.execute(StoreState.__table__.insert().values(name=name, value=value))


def write_watermark(conn: Any, ms: int) -> None:
    """Move the watermark, in the caller's transaction (the one that wrote the chunks)."""
    write_state(conn, WATERMARK, ms)


def head_samples(
    conn: Any, ids: Sequence[int], lo: int, hi: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Head samples in ``[lo, hi)`` ms of each series: times (ms) and values, time-sorted.

    Fetched whole into one array per batch: a detector shard reads its racks back every
    cycle, and building a Python row object per sample cost it most of its read.
    """
    parts: list[np.ndarray] = []
    cur = conn.connection.driver_connection.cursor()  # plain tuples: no row objects
    try:
        for batch in batches(ids):
            cur.execute(  # every interpolated value is an int
                f"SELECT ts, series_id, value FROM samples_head WHERE ts >= {int(lo)} "
                f"AND ts < {int(hi)} AND series_id IN ({in_list(batch)})"
            )
            rows = cur.fetchall()
            if rows:
                parts.append(np.array(rows, dtype=np.float64))
    finally:
        cur.close()
    if not parts:
        return {}
    table = np.concatenate(parts)  # ms times and ids are exact in float64 (< 2**53)
    sids, ts = table[:, 1].astype(np.int64), table[:, 0].astype(np.int64)
    order = np.lexsort((ts, sids))
    sids, ts, values = sids[order], ts[order], table[order, 2]
    starts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
    ends = np.r_[starts[1:], len(sids)]
    return {
        int(sids[a]): (ts[a:b], values[a:b])
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    }
