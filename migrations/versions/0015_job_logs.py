"""job_logs: what a job's training process printed, captured per attempt

Revision ID: 0015
Revises: 0012
Create Date: 2026-11-27 18:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=26), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("stream", sa.String(length=6), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_logs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_logs")),
    )
    op.create_index("ix_job_logs_job_id_attempt_id", "job_logs", ["job_id", "attempt", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_logs_job_id_attempt_id", table_name="job_logs")
    op.drop_table("job_logs")
