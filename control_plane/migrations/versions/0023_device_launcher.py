"""device_launcher: what the launcher under a device's agent last said

The agent's birth message carries its launcher's report (the release running, a crash loop
and its last error, how the last agent release on trial ended); ``devices show`` prints it.
NULL: no launcher, or an agent that predates the field.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 12:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("launcher", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("launcher")
