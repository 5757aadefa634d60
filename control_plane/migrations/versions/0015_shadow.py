"""rollouts.shadow and shadow_reports: on-device shadow comparison of a candidate version

A rollout may begin each wave with a shadow phase: its devices stage the candidate next to the
serving version and report how often the two agree on copies of live requests. The rollout
keeps its shadow settings and each wave's verdict; the devices' windows are stored to be
summed by the wave's gate. Null (no shadow) for rollouts made before.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.add_column(sa.Column("shadow", sa.JSON(), nullable=True))
    op.create_table(
        "shadow_reports",
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
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        sa.Column("serving_version", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("max_abs_diff", sa.Float(), nullable=True),
        sa.Column("rel_error_sum", sa.Float(), nullable=False),
        sa.Column("candidate_ms_sum", sa.Float(), nullable=False),
        sa.Column("serving_ms_sum", sa.Float(), nullable=False),
        sa.UniqueConstraint("time", "device_id", "seq", "model", name="uq_shadow_report_message"),
    )
    op.create_index(
        "ix_shadow_reports_candidate",
        "shadow_reports",
        ["model", "version", "sequence", "received_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_shadow_reports_candidate", table_name="shadow_reports")
    op.drop_table("shadow_reports")
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.drop_column("shadow")
