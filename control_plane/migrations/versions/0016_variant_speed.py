"""Reserved: measured rows per second of each served variant

A no-op until the change that needs it fills it in.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
