"""The start of a downstream's answer on an attempt's row, and the records that have an
error by id (a search by an error's words walks only them).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

ERRORS_INDEX = "ix_records_id_with_error"


def upgrade() -> None:
    # A plain ADD COLUMN: nullable, no default, so neither database rewrites the table.
    op.add_column("record_attempts", sa.Column("http_answer", sa.Text(), nullable=True))
    # A partial index: only the records with an error (a few of the journal) are in it, and
    # a record without one costs it nothing. A plain CREATE INDEX holds the journal's
    # writes on PostgreSQL while it is built; run the upgrade when the intake is quiet.
    has_error = sa.text("last_error IS NOT NULL")
    op.create_index(
        ERRORS_INDEX, "records", ["id"], sqlite_where=has_error, postgresql_where=has_error
    )


def downgrade() -> None:
    op.drop_index(ERRORS_INDEX, table_name="records")
    with op.batch_alter_table("record_attempts") as batch:
        batch.drop_column("http_answer")
