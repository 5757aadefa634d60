"""deployment_pause: who paused a deployment, and when

A paused deployment starts no rollout (new or returning devices, a changed version) and its
running rollout is paused with it, until an operator resumes it
(``POST /api/v1/deployments/{name}/pause`` and ``/resume``).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 12:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("paused_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("paused_at")
        batch.drop_column("paused_by")
