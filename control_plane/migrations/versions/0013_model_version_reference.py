"""model_versions.reference and .optimisation: a version's reference set and its variants' report

A version may carry a reference set (inputs with labels or expected outputs); the control plane
calibrates INT8 variants on it and judges every optimised variant against the FP32 model, and
keeps the last such report. Both are null for versions pushed before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 04:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.add_column(sa.Column("reference", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("optimisation", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.drop_column("optimisation")
        batch_op.drop_column("reference")
