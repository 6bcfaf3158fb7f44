"""Gangs: the nodes of a multi-node attempt (attempt_members), the queue's gang being formed
(forming_gangs), and the rendezvous endpoint on the attempt (job_attempts.master_addr/port)

Revision ID: 0014
Revises: 0012
Create Date: 2026-11-27 18:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "attempt_members",
        sa.Column("job_id", sa.String(length=26), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("gpu", sa.String(length=200), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_attempt_members_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", "node_rank", name=op.f("pk_attempt_members")),
        sa.UniqueConstraint(
            "job_id", "attempt", "worker", name=op.f("uq_attempt_members_job_id_attempt_worker")
        ),
    )
    op.create_table(
        "forming_gangs",
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.String(length=26), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_forming_gangs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_forming_gangs")),
    )
    op.add_column("job_attempts", sa.Column("master_addr", sa.String(length=200), nullable=True))
    op.add_column("job_attempts", sa.Column("master_port", sa.Integer(), nullable=True))


def downgrade() -> None:
    # In place, not batch mode (SQLite >= 3.35 drops a column in place; see 0008's downgrade).
    op.drop_column("job_attempts", "master_port")
    op.drop_column("job_attempts", "master_addr")
    op.drop_table("forming_gangs")
    op.drop_table("attempt_members")
