"""rollout_trace: a rollout's OpenTelemetry trace context, kept on its row

A rollout's spans (its own, its waves', its rollback's) stay open over many steps, on
whichever replica leads, across restarts: each is opened by storing its ids and start time
here and exported once it ends, by the process that ends it
(:mod:`control_plane.rollouts.tracing`). NULL: not traced (tracing off, or not sampled).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 09:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("trace", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("trace")
