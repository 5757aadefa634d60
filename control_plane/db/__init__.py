"""Persistence: SQLAlchemy 2 models, the states they store (:mod:`.states`), async sessions,
Alembic migrations. The floor of the control plane: it imports no area."""
