"""devices.trust_root_version: the trust root version a device said it holds

After ``keys rotate``, manifests are signed with a key that only the new trust root announces:
a device still on an older root refuses them, and an operator should see that before revoking
the old key. A device says which version it holds in its birth message (again whenever it
applies a new root), and the inventory keeps it: null for an agent that predates the field.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.add_column(sa.Column("trust_root_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.drop_column("trust_root_version")
