"""device_telemetry's dedupe key starts with the time too: no index by device is left

Revision 0004 kept one index by device, device_telemetry's key. At 5,000 devices it still cost
a quarter of ingest's CPU per message, growing with the table: every batch dirtied a page per
device in it. The key now starts with the time like the telemetry rows', so a batch appends,
and it serves retention's range by time in place of ``ix_device_telemetry_time``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 18:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("device_telemetry") as batch_op:
        batch_op.drop_constraint("uq_device_telemetry_message", type_="unique")
        batch_op.drop_index("ix_device_telemetry_time")
        batch_op.create_unique_constraint(
            "uq_device_telemetry_message", ["time", "device_id", "seq"]
        )


def downgrade() -> None:
    with op.batch_alter_table("device_telemetry") as batch_op:
        batch_op.drop_constraint("uq_device_telemetry_message", type_="unique")
        batch_op.create_index("ix_device_telemetry_time", ["time"], unique=False)
        batch_op.create_unique_constraint(
            "uq_device_telemetry_message", ["device_id", "seq", "time"]
        )
