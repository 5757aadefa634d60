"""telemetry dedupe keys that start with the time

The telemetry rows' dedupe key started with the device: a batch of ingest inserted at as many
places in it as it had devices, and SQLite wrote every page it touched whole to its log (at
5,000 devices more than the rows cost). It now starts with the time, so a batch appends, and
it serves retention's range by time in place of ``ix_telemetry_time``. ``device_telemetry``
keeps the one index by device, its key extended by the time so both tables take and refuse
the same messages.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NAMING = {"uq": "uq_%(table_name)s_%(column_0_N_name)s"}
"""Names for the unnamed unique constraints of 0001 as batch mode reflects them from SQLite
(which keeps no names for them)."""


def _drop_unique(batch_op: BatchOperations, table: str, columns: list[str]) -> None:
    """Drop the unique constraint on exactly ``columns``: by the name the database gave it
    (PostgreSQL), else by the name ``NAMING`` gives it."""
    for uq in sa.inspect(op.get_bind()).get_unique_constraints(table):
        if uq["column_names"] == columns:
            name = uq["name"] or f"uq_{table}_{'_'.join(columns)}"
            batch_op.drop_constraint(name, type_="unique")
            return
    raise RuntimeError(f"{table}: no unique constraint on {columns}")


def upgrade() -> None:
    with op.batch_alter_table("telemetry", naming_convention=NAMING) as batch_op:
        _drop_unique(batch_op, "telemetry", ["device_id", "seq", "model", "version"])
        batch_op.drop_index("ix_telemetry_time")
        batch_op.create_unique_constraint(
            "uq_telemetry_message", ["time", "device_id", "seq", "model", "version"]
        )
    with op.batch_alter_table("device_telemetry", naming_convention=NAMING) as batch_op:
        _drop_unique(batch_op, "device_telemetry", ["device_id", "seq"])
        batch_op.create_unique_constraint(
            "uq_device_telemetry_message", ["device_id", "seq", "time"]
        )


def downgrade() -> None:
    with op.batch_alter_table("device_telemetry") as batch_op:
        batch_op.drop_constraint("uq_device_telemetry_message", type_="unique")
        # the names PostgreSQL gave the constraints of 0001
        batch_op.create_unique_constraint(
            "device_telemetry_device_id_seq_key", ["device_id", "seq"]
        )
    with op.batch_alter_table("telemetry") as batch_op:
        batch_op.drop_constraint("uq_telemetry_message", type_="unique")
        batch_op.create_index("ix_telemetry_time", ["time"], unique=False)
        batch_op.create_unique_constraint(
            "telemetry_device_id_seq_model_version_key", ["device_id", "seq", "model", "version"]
        )
