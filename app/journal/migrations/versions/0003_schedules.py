"""Cron schedules, read by beat.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("line", sa.String(32), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("misfire", sa.String(16), nullable=False),
        sa.Column("catchup_window_s", sa.Integer(), nullable=False),
        sa.Column("last_fire_at", TS, nullable=True),
        sa.Column("next_fire_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_schedules"),
    )


def downgrade() -> None:
    op.drop_table("schedules")
