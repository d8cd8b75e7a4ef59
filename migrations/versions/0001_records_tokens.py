"""records and tokens

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "records",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("target_kind", sa.String(32), nullable=False),
        sa.Column("target_model", sa.String(128), nullable=False),
        sa.Column("target_keys", sa.String(255), nullable=False),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("workload_key", sa.Text, nullable=False),
        sa.Column("line", sa.JSON, nullable=False),
        sa.Column("mean_cost", sa.Float, nullable=False),
        sa.Column("error_no", sa.Integer, nullable=False),
        sa.Column("timestamp", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_records_target_kind", "records", ["target_kind"])
    op.create_index("ix_records_target_model", "records", ["target_model"])
    op.create_index("ix_records_template", "records", ["template"])
    op.create_index("ix_records_best", "records",
                    ["workload_key", "error_no", "mean_cost", "id"])
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_index("ix_records_best", "records")
    op.drop_index("ix_records_template", "records")
    op.drop_index("ix_records_target_model", "records")
    op.drop_index("ix_records_target_kind", "records")
    op.drop_table("records")
