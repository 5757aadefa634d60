"""model_versions.source: where a version's files came from (an MLflow registry's model)

``edgefleet models push NAME VERSION models:/REGISTERED@ALIAS`` records the MLflow model it
resolved (registered name, MLflow version, run id, the alias it came through) so that a
version can be traced back to the run that trained it, and ``models sync`` can tell whether
an alias points at something new. NULL: pushed from directories.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("source", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_column("source")
