"""The start of a downstream's answer on an attempt's row; the records that have an error
by id (a search by an error's words walks only them); the failed and the dead records by
id (the Retries and Dead lists of every line walk only them, in order).

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
TROUBLE_INDEXES = {"failed": "ix_records_failed_id", "dead": "ix_records_dead_id"}


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
    for name, within in (
        (TROUBLE_INDEXES["failed"], sa.text("status = 'failed'")),
        (TROUBLE_INDEXES["dead"], sa.text("status = 'dead'")),
    ):
        op.create_index(name, "records", ["id"], sqlite_where=within, postgresql_where=within)


def downgrade() -> None:
    for name in TROUBLE_INDEXES.values():
        op.drop_index(name, table_name="records")
    op.drop_index(ERRORS_INDEX, table_name="records")
    with op.batch_alter_table("record_attempts") as batch:
        batch.drop_column("http_answer")
