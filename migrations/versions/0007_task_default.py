"""tasks.default_index: the default config a task's search planned first

The scheduler plans the template's default config first and verifies it at the task's
end; which default that is depends on the devices serving the job (their SIMD lanes), so
it is stored as planned, and the verification and the model view read it rather than
work it out again from whatever workers are registered later. Null for the tasks stored
before (and for one whose default was not valid on its devices): they fall back to the
template's default without device limits, as before.

Revision ID: 0007
Revises: 0006_model
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006_model"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("default_index", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("default_index")
