"""Detector findings.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "findings",
        sa.Column("id", sa.String(300), primary_key=True),
        sa.Column("fingerprint", sa.String(300), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("detector", sa.String(40), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("rack", sa.String(200), nullable=False),
        sa.Column("entity", sa.JSON(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("raised_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("ended_ms", sa.BigInteger(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("causes", sa.JSON(), nullable=False),
    )
    op.create_index("ix_findings_fingerprint", "findings", ["fingerprint"])
    op.create_index("ix_findings_started_ms", "findings", ["started_ms"])
    op.create_index("ix_findings_open", "findings", ["ended_ms", "kind"])
    op.create_index("ix_findings_host", "findings", ["host", "started_ms"])
    op.create_index("ix_findings_rack", "findings", ["rack", "started_ms"])


def downgrade() -> None:
    op.drop_table("findings")
