"""records.cold: the record was timed with cold weights (its line's info says
``cpu_cache_flush``)

On a CPU device a trial timed with its weight in the cache costs up to 1.2-1.4x less than
the same kernel reading its weight from memory, as a layer in a model does; records of
both kinds compete for one workload where jobs with and without
``enable_cpu_cache_flush`` share a database. The rule ranks a device's cold records
before its warm ones (``compiler.templates.history``), so the lookup needs the flag
beside the cost: a column, filled in from the lines stored before, and (PostgreSQL) one
more INCLUDE column of ``ix_records_best`` so a lookup still ranks from the index alone
(rebuilt: the table is locked while it builds).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

KEY = ["workload_key", "error_no", "mean_cost", "id"]
INCLUDE = ["target_kind", "target_model", "target_keys", "target", "source",
           "verified_config"]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("cold", sa.Boolean, nullable=False,
                                   server_default=sa.false()))
    # the lines' info as the worker writes it ({"cpu_cache_flush": true}): JSON true
    # only (``schemas.record.timed_cold``), not 1; on PostgreSQL one pass over the table
    flag = ("(line::jsonb -> 'info' -> 'cpu_cache_flush') = 'true'::jsonb" if postgres
            else "json_type(line, '$.info.cpu_cache_flush') = 'true'")
    op.execute(f"UPDATE records SET cold = TRUE WHERE {flag}")
    if postgres:
        op.drop_index("ix_records_best", "records")
        op.create_index("ix_records_best", "records", KEY,
                        postgresql_include=[*INCLUDE, "cold"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_records_best", "records")
        op.create_index("ix_records_best", "records", KEY, postgresql_include=INCLUDE)
    with op.batch_alter_table("records") as batch:
        batch.drop_column("cold")
