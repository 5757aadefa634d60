"""generative_telemetry: tokens and token latencies of generative versions per window

A generative version's telemetry window carries its prompt and generated tokens and its p99
time to first token and between tokens: the rollout gates judge the latencies
(``max_ttft_p99_ms``, ``max_inter_token_p99_ms``), and the fleet's tokens/s per version is
read from the token counts, its cost per thousand tokens from the devices' (set where a device
has a ``device_hourly_cost``). Batch models' rows hold 0 and NULL.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry") as batch:
        batch.add_column(
            sa.Column("prompt_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("generated_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("ttft_p99_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("inter_token_p99_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("cost_per_1k_tokens", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("telemetry") as batch:
        batch.drop_column("cost_per_1k_tokens")
        batch.drop_column("inter_token_p99_ms")
        batch.drop_column("ttft_p99_ms")
        batch.drop_column("generated_tokens")
        batch.drop_column("prompt_tokens")
