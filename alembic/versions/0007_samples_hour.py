"""Hour chunks: a series' closed hour in one row, its minute statistics packed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

# The only migration importing app code: hour rows hold codec chunks (pcodec inside) and
# packed minute statistics that only these modules read; both formats are versioned and
# must stay readable for as long as stores hold them, so the import stays valid.
from hbmwatch.store import codec
from hbmwatch.store.backend import PARTITION_LOCK_SQL, partition_name
from hbmwatch.store.chunks import unpack_many

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

MINUTE_MS = 60_000
DAY_MS = 86_400_000
#: store/hours.py HOURS_PACKED: gone, a later upgrade re-packs every hour from the start
HOURS_PACKED = "hours_packed_until_ms"
#: hour rows per round trip: at one sample a second about 3.6 M samples, not the whole table
_PAGE = 1_000
_CHUNK = sa.table(
    "samples_chunk",
    *(sa.column(c, sa.BigInteger()) for c in ("series_id", "start_ms", "count", "last_ms")),
    *(sa.column(c, sa.Double()) for c in ("min", "max", "sum", "last")),
    sa.column("data", sa.LargeBinary()),
)


def upgrade() -> None:
    # Existing minute chunks stay where they are: compaction's hour pass re-packs them.
    op.create_table(
        "samples_hour",
        sa.Column("series_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("start_ms", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("minutes", sa.LargeBinary(), nullable=True),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        # A rowid table on SQLite: rows of up to a page stay whole in its leaves, where a
        # WITHOUT ROWID table spills past ~1 KB into overflow pages (store/models.py).
        postgresql_partition_by="RANGE (start_ms)",
    )
    if op.get_bind().dialect.name == "postgresql":
        # Day partitions are created by the store ahead of time; this one catches strays.
        op.execute("CREATE TABLE samples_hour_default PARTITION OF samples_hour DEFAULT")


def downgrade() -> None:
    """Every hour row back into the minute rows it replaced, then the table dropped: the hour
    pass deleted those minute rows, so dropping it alone would lose closed hours' samples."""
    conn = op.get_bind()
    postgres = conn.dialect.name == "postgresql"
    if postgres:  # as store/backend.py: one process at a time creates partitions
        conn.execute(sa.text(PARTITION_LOCK_SQL))
    page = sa.text(
        "SELECT series_id, start_ms, minutes, data FROM samples_hour "
        "WHERE (series_id, start_ms) > (:sid, :start) ORDER BY series_id, start_ms LIMIT :n"
    )
    after, days = (-1, -1), set[int]()
    while rows := conn.execute(page, {"sid": after[0], "start": after[1], "n": _PAGE}).all():
        minutes = _minute_rows([tuple(r) for r in rows])
        if postgres:
            days |= _day_partitions(conn, {m["start_ms"] for m in minutes}, days)
        if minutes:
            conn.execute(sa.insert(_CHUNK), minutes)
        after = (int(rows[-1][0]), int(rows[-1][1]))
    conn.execute(sa.text("DELETE FROM store_state WHERE name = :n"), {"n": HOURS_PACKED})
    op.drop_table("samples_hour")


def _minute_rows(hours: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``samples_chunk`` rows of hour rows (series_id, start_ms, minutes, data): a minute's
    statistics from ``minutes``, or from its raw samples where ``minutes`` has expired, and
    its samples as a minute chunk (``data`` None where the hour's raw samples expired)."""
    raw = _minute_chunks([h for h in hours if h[3] is not None])
    packed = [(h[0], h[1], bytes(h[2])) for h in hours if h[2] is not None]
    out = []
    if packed:
        sids, starts, blobs = zip(*packed, strict=True)
        for sid, start, *stats in unpack_many(blobs, starts, sids).tolist():
            key = (int(sid), int(start))
            out.append(_row(key, stats, raw.pop(key, (None,))[0]))
    # Minutes of expired statistics (or, were the two ever apart, raw samples of a minute
    # the statistics lack): kept, with statistics of their samples.
    out += [_row(key, stats, blob) for key, (blob, stats) in raw.items()]
    return out


def _minute_chunks(hours: list[tuple[Any, ...]]) -> dict[tuple[int, int], tuple[bytes, tuple]]:
    """Each (series, minute) of the hours' raw samples: its chunk and statistics (count, min,
    max, sum, last, last_ms), encoded in one call as compaction's minute pass encodes."""
    if not hours:
        return {}
    ts, values, counts = codec.decode_many([bytes(h[3]) for h in hours], [h[1] for h in hours])
    sids = np.repeat(np.array([h[0] for h in hours], dtype=np.int64), counts)
    order = np.lexsort((ts, sids))
    ts, values, sids = ts[order], values[order], sids[order]
    if len(ts) == 0:
        return {}
    minute = ts - ts % MINUTE_MS
    starts = np.flatnonzero(np.r_[True, (sids[1:] != sids[:-1]) | (minute[1:] != minute[:-1])])
    enc = codec.encode_segments(minute[starts], ts, values, starts)
    last_ms = ts[np.r_[starts[1:], len(ts)] - 1]
    columns = zip(
        sids[starts].tolist(), minute[starts].tolist(), enc.blobs, enc.count.tolist(),
        enc.min.tolist(), enc.max.tolist(), enc.sum.tolist(), enc.last.tolist(),
        last_ms.tolist(), strict=True,
    )  # fmt: skip
    return {(s, m): (blob, stats) for s, m, blob, *stats in columns}


def _row(key: tuple[int, int], stats: list, data: bytes | None) -> dict[str, Any]:
    """A ``samples_chunk`` row; ``stats``: count, min, max, sum, last, last_ms."""
    count, low, high, total, last, last_ms = stats
    return {
        "series_id": key[0], "start_ms": key[1], "count": int(count), "min": low, "max": high,
        "sum": total, "last": last, "last_ms": int(last_ms), "data": data,
    }  # fmt: skip


def _day_partitions(conn: Any, starts: set[int], made: set[int]) -> set[int]:
    """Create the missing day partitions of ``samples_chunk`` the rows land in (retention may
    have dropped them); a day whose rows already sit in the
    default partition stays there (a partition over them cannot be created).  Returns the
    days seen."""
    days = {s - s % DAY_MS for s in starts} - made
    for day in sorted(days):
        name = partition_name(day)
        if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None:
            continue
        strays = sa.text(
            "SELECT 1 FROM samples_chunk_default WHERE start_ms >= :lo AND start_ms < :hi LIMIT 1"
        )
        if conn.execute(strays, {"lo": day, "hi": day + DAY_MS}).first() is None:
            conn.execute(sa.text(
                f"CREATE TABLE {name} PARTITION OF samples_chunk "
                f"FOR VALUES FROM ({day}) TO ({day + DAY_MS})"
            ))  # fmt: skip
    return days
