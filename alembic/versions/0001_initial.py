"""Series registry, head and chunk samples, hourly rollups, store state, device inventory.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _stats() -> list[sa.Column]:
    return [
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("min", sa.Double(), nullable=False),
        sa.Column("max", sa.Double(), nullable=False),
        sa.Column("sum", sa.Double(), nullable=False),
        sa.Column("last", sa.Double(), nullable=False),
    ]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "series",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("metric", sa.String(200), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_series_metric", "series", ["metric"])
    op.create_table(
        "samples_head",
        sa.Column("ts", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("series_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("value", sa.Double(), nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "samples_chunk",
        sa.Column("series_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("start_ms", sa.BigInteger(), primary_key=True, autoincrement=False),
        *_stats(),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (start_ms)",
    )
    if postgres:
        # Day partitions are created by the store ahead of time; this one catches strays.
        op.execute("CREATE TABLE samples_chunk_default PARTITION OF samples_chunk DEFAULT")
    op.create_table(
        "rollup_1h",
        sa.Column("series_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("start_ms", sa.BigInteger(), primary_key=True, autoincrement=False),
        *_stats(),
        sa.Column("last_ms", sa.BigInteger(), nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "store_state",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=True),
    )
    op.create_table(
        "devices",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(200), nullable=False),
        sa.Column("rack", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("gpu", sa.String(20), nullable=False),
        sa.Column("partition", sa.String(20), nullable=False),
        sa.Column("uuid", sa.String(200), nullable=False),
        sa.Column("serial", sa.String(200), nullable=False),
        sa.Column("vendor", sa.String(20), nullable=False),
        sa.Column("sku", sa.String(50), nullable=False),
        sa.Column("compute_partition", sa.String(20), nullable=False),
        sa.Column("memory_partition", sa.String(20), nullable=False),
        sa.Column("driver", sa.String(100), nullable=False),
        sa.Column("first_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("cluster", "host", "gpu", "partition", name="uq_devices_identity"),
    )
    op.create_index("ix_devices_rack", "devices", ["cluster", "rack"])


def downgrade() -> None:
    for table in ("devices", "store_state", "rollup_1h", "samples_chunk", "samples_head",
                  "series"):
        op.drop_table(table)
