"""update_events: the phase details a device reports (download progress, health window)

A device's rollout row reads ``sent`` from the desired state's publication to the device's
outcome; what it did in between (downloading, so many bytes of so many; staged; in its health
window of so many seconds) comes with its update events, which are stored with these now and
shown as the device's phase on the rollout.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 01:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("update_events") as batch_op:
        batch_op.add_column(sa.Column("progress", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("bytes_done", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("bytes_total", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("window_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("update_events") as batch_op:
        for column in ("window_s", "bytes_total", "bytes_done", "progress"):
            batch_op.drop_column(column)
