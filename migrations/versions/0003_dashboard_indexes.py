"""dashboard: workers name their device; indexes for worker stats, recent results and
the best record per workload

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("device", sa.String(255), nullable=True))
    # a worker's trial counts without scanning every trial
    op.create_index("ix_trials_worker", "trials", ["worker_id", "status"])
    # "results in the last 10 minutes" reads only the newest records
    op.create_index("ix_records_created_at", "records", ["created_at"])
    # the best record per (target kind, device model, workload), for the pretuned log and
    # the dashboard's records search, found from this index without reading the records
    op.create_index("ix_records_groups", "records",
                    ["error_no", "target_kind", "target_model", "workload_key", "mean_cost",
                     "template"])


def downgrade() -> None:
    op.drop_index("ix_records_groups", "records")
    op.drop_index("ix_records_created_at", "records")
    op.drop_index("ix_trials_worker", "trials")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("device")
