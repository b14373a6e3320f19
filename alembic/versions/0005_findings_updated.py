"""Findings by the time they were last stated: the alert leader reads every shard's from here.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_findings_updated", "findings", ["updated_ms"])


def downgrade() -> None:
    op.drop_index("ix_findings_updated", table_name="findings")
