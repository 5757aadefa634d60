"""device logs: operators' requests for a device's logs or support bundle, and the answers

A signed ``logs`` or ``support-bundle`` command goes to the device; its answer comes back in
chunks on the telemetry topic and is appended here (``POST /api/v1/devices/{id}/logs``,
``edgefleet devices logs``).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07 20:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_diagnostics",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("total_bytes", sa.Integer(), nullable=True),
        sa.Column("received_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("error", sa.String(500), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_device_diagnostics_device", "device_diagnostics", ["device_id", "requested_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_device_diagnostics_device", table_name="device_diagnostics")
    op.drop_table("device_diagnostics")
