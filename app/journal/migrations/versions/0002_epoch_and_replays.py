"""Queue epoch on records (Redis lost its memory?) and the replay audit table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("queue_epoch", sa.String(36), nullable=True))
    op.create_index("ix_records_status_updated_at", "records", ["status", "updated_at"])
    op.create_table(
        "replays",
        sa.Column("id", sa.String(26), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("filter", JSON, nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("counts", JSON, nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_replays"),
    )


def downgrade() -> None:
    op.drop_table("replays")
    op.drop_index("ix_records_status_updated_at", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("queue_epoch")
