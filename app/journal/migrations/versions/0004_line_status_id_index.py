"""Records by (line, status, id): keyset pages of one line and status without a sort.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_records_line_status_id", "records", ["line", "status", "id"])
    op.drop_index("ix_records_line_status", table_name="records")


def downgrade() -> None:
    op.create_index("ix_records_line_status", "records", ["line", "status"])
    op.drop_index("ix_records_line_status_id", table_name="records")
