"""variant_speeds: the rows per second devices measured for the variant they serve

The agent's batch tuning measures a version's rows per second where it runs; the latest per
model version and hardware profile is kept, and ``models list`` shows it next to each
variant's accuracy.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "variant_speeds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("profile", sa.String(128), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("rows_per_s", sa.Float(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("placement", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("model", "version", "profile", name="uq_variant_speed"),
    )


def downgrade() -> None:
    op.drop_table("variant_speeds")
