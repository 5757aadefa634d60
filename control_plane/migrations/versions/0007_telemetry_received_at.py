"""telemetry.received_at: when the control plane stored a window, for the health gates

The gates chose a rollout's windows by the time the device reported, by its own clock: a device
whose clock was behind by more than the rollout's age (or ahead at all) reported windows the
gates never saw, and a rollout went on over them. They choose by the control plane's time of
receipt now, and their index is (model, version, received_at) in place of (model, version,
time): ingest writes one index for them, not two.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry") as batch_op:
        batch_op.add_column(sa.Column("received_at", sa.DateTime(timezone=True), nullable=True))
    # When the windows stored before this revision arrived is not known; their own time is
    # what the gates went by until now, so they are judged as they were (a rollout running
    # across the upgrade keeps them). Filled in, the column takes NOT NULL, and the gates and
    # the API compare it with no NULL case. (The table holds the raw retention's windows
    # only, two days by default: one pass over them.)
    op.execute("UPDATE telemetry SET received_at = time")
    with op.batch_alter_table("telemetry") as batch_op:
        batch_op.alter_column(
            "received_at", existing_type=sa.DateTime(timezone=True), nullable=False
        )
        batch_op.drop_index("ix_telemetry_model_time")
        batch_op.create_index(
            "ix_telemetry_model_received", ["model", "version", "received_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("telemetry") as batch_op:
        batch_op.drop_index("ix_telemetry_model_received")
        batch_op.create_index("ix_telemetry_model_time", ["model", "version", "time"], unique=False)
        batch_op.drop_column("received_at")
