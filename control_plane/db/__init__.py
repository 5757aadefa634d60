"""Persistence: SQLAlchemy 2 models, async sessions, Alembic migrations."""
