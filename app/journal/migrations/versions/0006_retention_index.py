"""Records by (status, finished_at): retention finds the expired `done` records, oldest
first, without reading the others.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain CREATE INDEX: on PostgreSQL it holds the journal's writes while it is built
    # (seconds on a journal of a few million rows); run the upgrade when the intake is quiet.
    op.create_index("ix_records_status_finished_at", "records", ["status", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_records_status_finished_at", table_name="records")
