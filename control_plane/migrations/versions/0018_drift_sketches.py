"""drift_sketches: the drift monitor's merged windows per model version and device

The sketches a device's telemetry windows carry, merged with decay, lived in one replica's
memory: a second replica, or a restarted one, judged from what it had merged itself. Kept here,
every replica merges into and judges from the same state (control_plane/quality/drift_monitor.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 01:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drift_sketches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.String(length=128), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("rows", sa.Float(), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("over", sa.Boolean(), nullable=False),
        sa.Column("sketch", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "version", "device_id", name="uq_drift_sketches"),
    )
    op.create_index("ix_drift_sketches_updated_at", "drift_sketches", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_drift_sketches_updated_at", table_name="drift_sketches")
    op.drop_table("drift_sketches")
