"""model jobs: a job remembers the model its tasks come from, a task the layers it serves

- ``jobs.model``: the model's name (null for a job of given tasks, and for every job
  stored before).
- ``tasks.layers``: the names of the model's layers that run the task's kernel, as a JSON
  list (null: unknown; the dashboard counts such a task as one layer).

Both columns are nullable and carry no default, so the upgrade writes no row.

Revision ID: 0006_model
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_model"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("model", sa.String(255), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("layers", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("layers")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("model")
