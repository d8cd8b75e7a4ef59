"""Alembic migrations for the server's database; run them with ``tuner db upgrade``."""
