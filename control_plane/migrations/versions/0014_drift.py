"""input_drift: the latest input drift per model version and device (or the fleet)

Devices send sketches of their inputs in telemetry; the control plane compares them with the
version's reference set and keeps the latest result here (control_plane/quality/drift_monitor.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "input_drift",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.String(length=128), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rows", sa.Float(), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("psi", sa.Float(), nullable=False),
        sa.Column("ks", sa.Float(), nullable=False),
        sa.Column("wasserstein", sa.Float(), nullable=False),
        sa.Column("feature", sa.String(length=160), nullable=False),
        sa.Column("features", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "version", "device_id", name="uq_input_drift"),
    )


def downgrade() -> None:
    op.drop_table("input_drift")
