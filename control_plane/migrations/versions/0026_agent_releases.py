"""agent_releases: agent releases in the registry, and rollouts of them

A release tree's ``.tar.gz`` is stored by digest in the artifact store, with a fleet-wide
sequence (the devices' anti-rollback line); ``rollouts.agent_version`` names the release an
agent rollout ships (NULL: a model's rollout).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_releases",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("version", sa.String(64), nullable=False, unique=True),
        sa.Column("sequence", sa.BigInteger(), nullable=False, unique=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("uploaded_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("agent_version", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("agent_version")
    op.drop_table("agent_releases")
