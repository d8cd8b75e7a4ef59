"""Server logic behind the routes: plain functions over a SQLAlchemy session."""
