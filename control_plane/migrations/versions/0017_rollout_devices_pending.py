"""rollout_devices by (rollout, state, position): a wave's next chunk without a scan

A rollout sends its wave's manifests a chunk at a time (``control_plane.rollouts.sending``),
each chunk the next pending devices by position. Without this index every chunk read all of
the rollout's device rows (20,000 at the largest fleet measured) to find a thousand.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 07:20:00
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_rollout_devices_pending", "rollout_devices", ["rollout_id", "state", "position"]
    )


def downgrade() -> None:
    op.drop_index("ix_rollout_devices_pending", table_name="rollout_devices")
