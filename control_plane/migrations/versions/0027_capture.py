"""capture: samples devices captured for retraining

A model whose config enables ``[capture]`` spools sampled requests and answers on its device
and uploads them on the telemetry topic; each is stored here once per (device, sample id),
its tensors as the ``.npz`` archive the device sent, and listed and exported per version
(``GET /api/v1/models/{m}/versions/{v}/samples``, ``edgefleet data``).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "captured_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
        ),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("sample_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("device_id", "sample_id", name="uq_captured_samples_device_sample"),
    )
    op.create_index("ix_captured_samples_version", "captured_samples", ["model", "version", "id"])


def downgrade() -> None:
    op.drop_index("ix_captured_samples_version", table_name="captured_samples")
    op.drop_table("captured_samples")
