"""The journal and the built-in sink tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def _keyed_sink(name: str) -> None:
    op.create_table(
        name,
        sa.Column("business_no", sa.String(128), nullable=False),
        sa.Column("record_id", sa.String(26), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("business_no", name=f"pk_{name}"),
    )


def upgrade() -> None:
    op.create_table(
        "records",
        sa.Column("id", sa.String(26), nullable=False),
        sa.Column("line", sa.String(32), nullable=False),
        sa.Column("business_no", sa.String(128), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("dedup_key", sa.String(320), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", TS, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_records"),
        sa.UniqueConstraint("dedup_key", name="uq_records_dedup_key"),
    )
    op.create_index("ix_records_status_next_attempt_at", "records", ["status", "next_attempt_at"])
    op.create_index("ix_records_line_status", "records", ["line", "status"])
    op.create_index("ix_records_business_no", "records", ["business_no"])
    op.create_index("ix_records_created_at", "records", ["created_at"])
    _keyed_sink("orders")
    _keyed_sink("refunds")
    op.create_table(
        "order_status",
        sa.Column("business_no", sa.String(128), nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("occurred_at", TS, nullable=False),
        sa.Column("record_id", sa.String(26), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("business_no", name="pk_order_status"),
    )
    op.create_table(
        "sink_rows",
        sa.Column("line", sa.String(32), nullable=False),
        sa.Column("business_no", sa.String(128), nullable=False),
        sa.Column("record_id", sa.String(26), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("line", "business_no", name="pk_sink_rows"),
    )


def downgrade() -> None:
    for table in ("sink_rows", "order_status", "refunds", "orders", "records"):
        op.drop_table(table)
