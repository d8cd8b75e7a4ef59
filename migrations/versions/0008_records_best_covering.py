"""records: the best lookup's index carries what the rule ranks by (PostgreSQL)

``ix_records_best`` gains the columns a records/best lookup reads of each candidate (its
target, kind, model, keys, source, verified config) as INCLUDE columns, so PostgreSQL
ranks a workload's candidates from the index alone (an index-only scan) and reads the
heap only for the few whose lines it returns: at 1,000 records a workload the lookup
read ~600 heap rows. SQLite has no INCLUDE; its index is left as it was.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

KEY = ["workload_key", "error_no", "mean_cost", "id"]
INCLUDE = ["target_kind", "target_model", "target_keys", "target", "source",
           "verified_config"]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_records_best", "records")
    op.create_index("ix_records_best", "records", KEY, postgresql_include=INCLUDE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_records_best", "records")
    op.create_index("ix_records_best", "records", KEY)
