"""Hour chunks: a series' closed hour in one row, its minute statistics packed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


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
    op.drop_table("samples_hour")
