"""telemetry indexes for ingest: no (device_id, time) indexes; device_telemetry by time

The dedupe keys (device_id, seq, ...) serve per-device queries; the (device_id, time)
indexes doubled what SQLite wrote per ingested message.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_device_time")
    with op.batch_alter_table("device_telemetry", schema=None) as batch_op:
        batch_op.drop_index("ix_device_telemetry_time")
        batch_op.create_index("ix_device_telemetry_time", ["time"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("device_telemetry", schema=None) as batch_op:
        batch_op.drop_index("ix_device_telemetry_time")
        batch_op.create_index("ix_device_telemetry_time", ["device_id", "time"], unique=False)
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_device_time", ["device_id", "time"], unique=False)
