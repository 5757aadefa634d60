"""Reserved: on-device shadow comparison of a candidate version

A no-op until the change that needs it fills it in.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
