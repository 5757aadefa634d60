"""config_twins: desired configuration per device or label group, and what devices report

A twin row holds settings and application keys for one device (``device_id``) or for the
devices a label selector matches (``selector``); each device's merged document is signed
into ``devices.desired['@twin']`` with a per-device ``devices.twin_version``, and the
device's report of it (its status) lands in ``devices.twin_reported``.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07 20:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "config_twins",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("target", sa.String(512), nullable=False, unique=True),
        sa.Column("device_id", sa.String(128), nullable=True),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("app", sa.JSON(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("devices") as batch:
        batch.add_column(
            sa.Column("twin_version", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("twin_reported", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("twin_reported")
        batch.drop_column("twin_version")
    op.drop_table("config_twins")
