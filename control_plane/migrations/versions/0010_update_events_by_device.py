"""update_events by device: a device's update history without a scan of the table

``GET /api/v1/devices/{id}/events`` reads a device's most recent events; without an index on
the device the query read the whole table, which grows with every rollout to every device.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 02:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_update_events_device", "update_events", ["device_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_update_events_device", table_name="update_events")
