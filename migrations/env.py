"""Alembic environment: the URL comes from the caller (``tuner db upgrade``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tuner_server.db.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
connection = config.attributes.get("connection")


def _run(conn: object) -> None:
    context.configure(connection=conn, target_metadata=Base.metadata,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
