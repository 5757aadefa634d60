"""ground_truth: the outcomes apps posted for devices' predictions, per window and label

Each telemetry window of a version whose predictions got outcomes carries their sums per
true label (``ModelTelemetry.ground_truth``); they are stored as they come, one row per window
and label, and summed into live accuracy (or error) per version, device, label and time
bucket when read, and by the ``max_accuracy_drop`` gate.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ground_truth",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
        ),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("label", sa.Integer(), nullable=False),
        sa.Column("outcomes", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.Column("abs_error_sum", sa.Float(), nullable=False),
        sa.Column("squared_error_sum", sa.Float(), nullable=False),
        sa.UniqueConstraint(
            "time", "device_id", "seq", "model", "version", "label", name="uq_ground_truth_window"
        ),
    )
    op.create_index("ix_ground_truth_version", "ground_truth", ["model", "version", "received_at"])


def downgrade() -> None:
    op.drop_index("ix_ground_truth_version", table_name="ground_truth")
    op.drop_table("ground_truth")
