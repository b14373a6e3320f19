"""The head as one row per write batch and minute (raw column arrays), not one per sample.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MINUTE_MS = 60_000
#: samples moved per round trip, so a large old head is not read into memory whole
_PAGE = 1_000_000


def upgrade() -> None:
    op.create_table(
        "samples_head_batch",
        sa.Column("seq", Id, primary_key=True, autoincrement=True),
        sa.Column("minute_ms", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("ts", sa.LargeBinary(), nullable=False),
        sa.Column("series_id", sa.LargeBinary(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_samples_head_batch_minute", "samples_head_batch", ["minute_ms"])
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT ts, series_id, value FROM samples_head ORDER BY ts"))
    insert = sa.text(
        "INSERT INTO samples_head_batch (minute_ms, n, ts, series_id, value) "
        "VALUES (:minute_ms, :n, :ts, :series_id, :value)"
    )
    while page := rows.fetchmany(_PAGE):
        data = np.array([tuple(r) for r in page], dtype=np.float64)
        ts, sids = data[:, 0].astype(np.int64), data[:, 1].astype(np.int64)
        values = data[:, 2].astype("<f8")
        minutes = ts - ts % MINUTE_MS
        conn.execute(insert, [
            _batch(minute, ts[pick] - minute, sids[pick], values[pick])
            for minute, pick in ((m, minutes == m) for m in np.unique(minutes).tolist())
        ])  # fmt: skip
    op.drop_table("samples_head")


def _batch(minute: int, offsets: np.ndarray, sids: np.ndarray, values: np.ndarray) -> dict:
    """A head row as store/head.py writes it: uint16 ms after the minute, uint32 series ids
    (int64 past 2**32), float64 values."""
    wide = int(sids.max()) > 0xFFFF_FFFF
    return {
        "minute_ms": minute, "n": len(offsets), "ts": offsets.astype("<u2").tobytes(),
        "series_id": sids.astype("<i8" if wide else "<u4").tobytes(),
        "value": values.tobytes(),
    }  # fmt: skip


def downgrade() -> None:
    op.create_table(
        "samples_head",
        sa.Column("ts", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("series_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("value", sa.Double(), nullable=False),
        sqlite_with_rowid=False,
    )
    conn = op.get_bind()
    batches = conn.execute(
        sa.text("SELECT minute_ms, n, ts, series_id, value FROM samples_head_batch ORDER BY seq")
    )
    # In write order, ignoring repeats: the first value written of (series, ts) wins.
    insert = sa.text(
        "INSERT INTO samples_head (ts, series_id, value) VALUES (:ts, :series_id, :value) "
        "ON CONFLICT DO NOTHING"
    )
    for minute, n, ts_blob, sid_blob, value_blob in batches.fetchall():
        ts = (np.frombuffer(bytes(ts_blob), "<u2").astype(np.int64) + minute).tolist()
        wide = len(sid_blob) != 4 * n
        sids = np.frombuffer(bytes(sid_blob), "<i8" if wide else "<u4").tolist()
        values = np.frombuffer(bytes(value_blob), "<f8").tolist()
        conn.execute(
            insert,
            [{"ts": t, "series_id": s, "value": v} for t, s, v in zip(ts, sids, values, strict=True)],
        )
    op.drop_index("ix_samples_head_batch_minute", table_name="samples_head_batch")
    op.drop_table("samples_head_batch")
