"""Attempts: one row per attempt of a record, kept through replays and retries.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "record_attempts",
        sa.Column("id", sa.String(26), nullable=False),
        sa.Column("record_id", sa.String(26), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=False),
        sa.Column("worker_host", sa.String(100), nullable=False),
        sa.Column("worker_pid", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(128), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_record_attempts"),
    )
    op.create_index(
        "ix_record_attempts_record_id_id", "record_attempts", ["record_id", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_record_attempts_record_id_id", table_name="record_attempts")
    op.drop_table("record_attempts")
