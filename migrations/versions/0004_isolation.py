"""isolation: tokens bound to one worker, workers that deregister, records that say
whether this fleet measured them or they were imported, a failed task's reason

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        # set on the token a registration hands out: it speaks for that worker only
        batch.add_column(sa.Column("worker_id", sa.Integer, nullable=True))
    op.create_index("ix_tokens_worker_id", "tokens", ["worker_id"])
    with op.batch_alter_table("workers") as batch:
        # unix seconds of its deregistration (SIGTERM); null while it serves
        batch.add_column(sa.Column("stopped_at", sa.Float, nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("error", sa.Text, nullable=True))
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=False,
                                   server_default="measured"))
    # records that are no trial's result came in through import
    op.execute("UPDATE records SET source = 'imported' WHERE trial_id IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("source")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("error")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("stopped_at")
    op.drop_index("ix_tokens_worker_id", "tokens")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("worker_id")
