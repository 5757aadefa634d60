"""Reserved: zero-touch enrolment at scale

A no-op until the change that needs it fills it in.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 06:30:00
"""

from __future__ import annotations

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
