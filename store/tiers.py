"""How samples sit at rest, shared by the write path, compaction and the queries.

Samples land in the head (store/head.py), closed minutes move into per-series minute chunks
and fold into hourly rollups; the compaction watermark says up to where the chunks are
complete.  Series ids are sent to the database in bounded ``IN (...)`` lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

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
