"""The server's database: SQLAlchemy models, engine and schema checks."""
