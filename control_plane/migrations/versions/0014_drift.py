"""Reserved: input drift sketches and the drift they measure

A no-op until the change that needs it fills it in.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
