"""The lease of the attempt running a record: its owner and its expiry.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs: nullable, no default, so neither database rewrites the table.
    op.add_column("records", sa.Column("lease_owner", sa.String(128), nullable=True))
    op.add_column(
        "records", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index("ix_records_lease_expires_at", "records", ["lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_records_lease_expires_at", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
