"""Storage: SQLAlchemy models, engine setup, repository functions and Alembic migrations."""
