"""verification: a task's best configs measured again, side by side, when its search ends

- ``jobs.verify_top``: how many of each task's best configs are verified (0 for the jobs
  stored before: they end as they always did).
- ``trials.verify_round``: 0 for a search trial, n >= 1 for round n of the verification;
  a config is measured once per round, so the unique key becomes (task, config, round).
- ``records.verified_config``: the config index a verification record re-measured (null
  for every record stored before: none of them was a verification).

Downgrade deletes the verification trials and their records: the older schema cannot
hold a config measured twice in one task. A task still verifying becomes done (its
search had ended; the older code knows no "verifying").

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("verify_top", sa.Integer, nullable=False,
                                   server_default="0"))
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("verify_round", sa.Integer, nullable=False,
                                   server_default="0"))
        batch.drop_constraint("uq_trials_task_config", type_="unique")
        batch.create_unique_constraint("uq_trials_task_config_round",
                                       ["task_id", "config_index", "verify_round"])
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("verified_config", sa.BigInteger, nullable=True))
    op.create_index("ix_records_verified", "records", ["verified_config"])


def downgrade() -> None:
    op.execute("DELETE FROM records WHERE verified_config IS NOT NULL")
    op.execute("DELETE FROM trials WHERE verify_round > 0")
    # the older code has no such status; a verifying task's search had ended
    op.execute("UPDATE tasks SET status = 'done' WHERE status = 'verifying'")
    op.drop_index("ix_records_verified", "records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("verified_config")
    with op.batch_alter_table("trials") as batch:
        batch.drop_constraint("uq_trials_task_config_round", type_="unique")
        batch.create_unique_constraint("uq_trials_task_config", ["task_id", "config_index"])
        batch.drop_column("verify_round")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("verify_top")
