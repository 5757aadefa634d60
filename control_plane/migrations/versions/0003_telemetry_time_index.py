"""telemetry by time, for retention

Retention looked for windows older than the raw retention with no index on their time: every
maintenance pass read the whole telemetry table. Rows arrive in time order, so this index only
appends.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_time", ["time"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_time")
