"""The time of each minute chunk's last sample, so the minute tier stands where its sample was.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: chunks written before this revision read as standing at their minute's end.
    op.add_column("samples_chunk", sa.Column("last_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples_chunk", "last_ms")
