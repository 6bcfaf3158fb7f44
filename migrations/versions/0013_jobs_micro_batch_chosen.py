"""jobs.micro_batch_chosen: the (m, N) micro_batch_size "auto" chose, stored where it is read

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("micro_batch_chosen", sa.JSON))
events = sa.table("job_events", sa.column("id", sa.Integer), sa.column("job_id", sa.String),
                  sa.column("kind", sa.String), sa.column("data", sa.JSON))


def upgrade() -> None:
    op.add_column("jobs", sa.Column("micro_batch_chosen", sa.JSON(none_as_null=True), nullable=True))
    # Until now the choice was a `micro_batch_chosen` event: carried over, so a job that chose
    # before the upgrade keeps its (m, N) at its next attempt (the latest event wins).
    connection = op.get_bind()
    chosen: dict[str, dict[str, int]] = {}
    rows = connection.execute(
        sa.select(events.c.job_id, events.c.data).where(events.c.kind == "micro_batch_chosen")
        .order_by(events.c.id)
    )
    for job_id, data in rows:
        if isinstance(data, dict) and {"micro_batch_size", "accumulation_steps"} <= data.keys():
            chosen[job_id] = {"micro_batch_size": int(data["micro_batch_size"]),
                              "accumulation_steps": int(data["accumulation_steps"])}
    for job_id, choice in chosen.items():
        connection.execute(jobs.update().where(jobs.c.id == job_id).values(micro_batch_chosen=choice))


def downgrade() -> None:
    # In place, not batch mode (see 0010's downgrade); the events keep the choices.
    op.drop_column("jobs", "micro_batch_chosen")
