"""devices.telemetry_interval_s: how often a device said it publishes telemetry

The control plane shows a device whose last status is online, but from which nothing has come
for several of these intervals, as silent rather than online (control_plane.ingest.presence).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 23:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.add_column(sa.Column("telemetry_interval_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.drop_column("telemetry_interval_s")
