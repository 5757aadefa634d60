"""leader_leases: which control plane replica leads, with its fencing epoch

Replicas sharing one PostgreSQL database elect the one that runs the rollout engine, the
deployments reconciler and telemetry maintenance by a lease row with an expiry; its epoch
grows at every grant, and every write of those loops checks it (control_plane.leadership).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 04:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_leases")
