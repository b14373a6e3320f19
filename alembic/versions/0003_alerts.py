"""Alerts, incidents, silences and the delivery outbox.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column("fingerprint", sa.String(40), nullable=False),
        sa.Column("source", sa.String(40), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("alertname", sa.String(100), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("finding_id", sa.String(300), nullable=False),
        sa.Column("incident_id", sa.String(40), nullable=True),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("firing_ms", sa.BigInteger(), nullable=True),
        sa.Column("ending_ms", sa.BigInteger(), nullable=True),
        sa.Column("resolved_ms", sa.BigInteger(), nullable=True),
        sa.Column("silenced_by", sa.JSON(), nullable=False),
        sa.Column("inhibited_by", sa.JSON(), nullable=False),
        sa.Column("flaps", sa.Integer(), nullable=False),
    )
    op.create_index("ix_alerts_fingerprint", "alerts", ["fingerprint"])
    op.create_index("ix_alerts_state", "alerts", ["state", "updated_ms"])
    op.create_index("ix_alerts_incident", "alerts", ["incident_id"])
    op.create_index("ix_alerts_resolved", "alerts", ["resolved_ms"])
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("scope", sa.JSON(), nullable=False),
        sa.Column("rack", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("opened_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("resolved_ms", sa.BigInteger(), nullable=True),
        sa.Column("acknowledged_by", sa.String(200), nullable=True),
        sa.Column("acknowledged_ms", sa.BigInteger(), nullable=True),
        sa.Column("alerts", sa.JSON(), nullable=False),
        sa.Column("causes", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("timeline", sa.JSON(), nullable=False),
    )
    op.create_index("ix_incidents_state", "incidents", ["state", "updated_ms"])
    op.create_index("ix_incidents_opened", "incidents", ["opened_ms"])
    op.create_table(
        "silences",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_ms", sa.BigInteger(), nullable=False),
        sa.Column("ends_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_silences_ends_ms", "silences", ["ends_ms"])
    op.create_table(
        "alert_deliveries",
        sa.Column("receiver", sa.String(64), primary_key=True),
        sa.Column("alert_id", sa.String(100), primary_key=True),
        sa.Column("sent_state", sa.String(16), nullable=False),
        sa.Column("sent_ms", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    for table in ("alert_deliveries", "silences", "incidents", "alerts"):
        op.drop_table(table)
