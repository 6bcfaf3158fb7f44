"""the fleet: the workers registry, job attempts, jobs.worker_name and jobs.priority

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 01:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("datasets", sa.JSON(), nullable=False),
        sa.Column("plugins", sa.JSON(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("accum_version", sa.String(length=50), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )
    op.create_index("ix_workers_last_seen", "workers", ["last_seen"])
    op.create_table(
        "job_attempts",
        sa.Column("job_id", sa.String(length=26), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("gpu", sa.String(length=200), nullable=True),
        sa.Column("resume_step", sa.Integer(), nullable=True),
        sa.Column("end_step", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_job_attempts")),
    )
    # Batch mode: SQLite cannot drop columns in place on every version; a no-op elsewhere.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("worker_name", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="1", nullable=False))
        batch.create_index(
            "ix_jobs_queue_status_priority_id", ["queue", "status", "priority", "id"]
        )


def downgrade() -> None:
    # Not batch mode: on SQLite it copies `jobs`, and dropping the old table would cascade to
    # every checkpoint, metric and event row (foreign keys are on). SQLite >= 3.35 drops a
    # column in place.
    op.drop_index("ix_jobs_queue_status_priority_id", table_name="jobs")
    op.drop_column("jobs", "priority")
    op.drop_column("jobs", "worker_name")
    op.drop_table("job_attempts")
    op.drop_index("ix_workers_last_seen", table_name="workers")
    op.drop_table("workers")
