"""claims, enrolments, deployments, maintenance windows; rollouts.deployment_id

Zero-touch provisioning keeps the claim credentials operators issue and the devices that
presented one (pending, approved, rejected, enrolled). Continuous deployments bind a model
version to a label selector, and the rollouts they start name them. Maintenance windows say
when the devices of a selector may start an update.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 04:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("secret_hash", sa.String(128), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("profiles", sa.JSON(), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("require_approval", sa.Boolean(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "enrolments",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("claim_id", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.String(128), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("hardware_profile", sa.String(128), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("issued_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_enrolments_claim_id", "enrolments", ["claim_id"])
    op.create_index("ix_enrolments_state", "enrolments", ["state"])
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("profiles", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("waves", sa.JSON(), nullable=False),
        sa.Column("bake_time_s", sa.Float(), nullable=False),
        sa.Column("device_timeout_s", sa.Float(), nullable=False),
        sa.Column("gates", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_deployments_model", "deployments", ["model"])
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.add_column(sa.Column("deployment_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_rollouts_deployment_id", ["deployment_id"])


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.drop_index("ix_rollouts_deployment_id")
        batch_op.drop_column("deployment_id")
    op.drop_table("maintenance_windows")
    op.drop_index("ix_deployments_model", table_name="deployments")
    op.drop_table("deployments")
    op.drop_index("ix_enrolments_state", table_name="enrolments")
    op.drop_index("ix_enrolments_claim_id", table_name="enrolments")
    op.drop_table("enrolments")
    op.drop_table("claims")
