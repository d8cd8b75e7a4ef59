"""records: a unique hash of each record's input, config and result, so an import stores
a line at most once even when two imports run at once (ON CONFLICT DO NOTHING)

Existing rows get their hash (``tuner_server.db.models.record_hash``). Where stored rows
already repeat one another (two imports of one log that raced before this key existed),
the first stored (lowest id) is kept and the later copies are deleted: the unique index
cannot be built over them.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuner_server.db.models import record_hash

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BATCH = 5000

records = sa.table("records", sa.column("id", sa.Integer), sa.column("line", sa.JSON),
                   sa.column("line_hash", sa.String(64)))


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("line_hash", sa.String(64), nullable=True))
    bind = op.get_bind()
    last = 0
    while True:
        rows = bind.execute(sa.select(records.c.id, records.c.line)
                            .where(records.c.id > last).order_by(records.c.id)
                            .limit(BATCH)).all()
        if not rows:
            break
        bind.execute(sa.update(records).where(records.c.id == sa.bindparam("row_id"))
                     .values(line_hash=sa.bindparam("hash")),
                     [{"row_id": row_id, "hash": record_hash(line)} for row_id, line in rows])
        last = rows[-1][0]
    first = sa.select(sa.func.min(records.c.id)).group_by(records.c.line_hash)
    bind.execute(sa.delete(records).where(records.c.id.not_in(first)))
    with op.batch_alter_table("records") as batch:
        batch.alter_column("line_hash", existing_type=sa.String(64), nullable=False)
    op.create_index("uq_records_line_hash", "records", ["line_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_records_line_hash", "records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("line_hash")
