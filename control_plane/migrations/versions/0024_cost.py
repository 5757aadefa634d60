"""cost: devices' hourly cost rates, and each telemetry window's busy time

``cost_rates`` holds what an operator says an hour of a device costs (by label, hardware
profile, or for every other device); ``telemetry.busy_s`` the device time a version's batches
took in a window. Together: cost per thousand predictions (:mod:`control_plane.quality.cost`).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cost_rates",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(257), nullable=False),
        sa.Column("per_hour", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("kind", "key"),
    )
    with op.batch_alter_table("telemetry") as batch:
        batch.add_column(sa.Column("busy_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("telemetry") as batch:
        batch.drop_column("busy_s")
    op.drop_table("cost_rates")
