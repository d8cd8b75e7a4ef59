"""jobs, tasks, trials, workers; records know their trial

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("tuner", sa.String(32), nullable=False),
        sa.Column("n_trial", sa.Integer, nullable=False),
        sa.Column("early_stopping", sa.Integer, nullable=True),
        sa.Column("plan_size", sa.Integer, nullable=False),
        sa.Column("measure", sa.JSON, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("args", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("trials_planned", sa.Integer, nullable=False),
        sa.Column("trials_done", sa.Integer, nullable=False),
        sa.Column("best_cost", sa.Float, nullable=True),
        sa.Column("best_trial", sa.Integer, nullable=True),
    )
    op.create_index("ix_tasks_job_id", "tasks", ["job_id"])
    op.create_index("ix_tasks_status", "tasks", ["status"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("task_id", sa.Integer, sa.ForeignKey("tasks.id"), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("config_index", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.Integer, nullable=True),
        sa.Column("lease_deadline", sa.Float, nullable=True),
        sa.Column("error_no", sa.Integer, nullable=True),
        sa.UniqueConstraint("task_id", "config_index", name="uq_trials_task_config"),
    )
    op.create_index("ix_trials_task_id", "trials", ["task_id"])
    op.create_index("ix_trials_queue", "trials", ["status", "queue", "id"])
    op.create_index("ix_trials_lease", "trials", ["status", "lease_deadline"])
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("limits", sa.JSON, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("trial_id", sa.Integer, nullable=True))
        batch.create_unique_constraint("uq_records_trial_id", ["trial_id"])


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_constraint("uq_records_trial_id", type_="unique")
        batch.drop_column("trial_id")
    op.drop_table("workers")
    op.drop_table("trials")
    op.drop_table("tasks")
    op.drop_table("jobs")
