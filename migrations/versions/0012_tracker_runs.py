"""tracker_runs: each job's run in MLflow, TensorBoard and W&B, and how far it was delivered

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 15:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tracker_runs",
        sa.Column("job_id", sa.String(length=26), nullable=False),
        sa.Column("tracker", sa.String(length=20), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("delivered_step", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("undelivered", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_tracker_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "tracker", name=op.f("pk_tracker_runs")),
    )


def downgrade() -> None:
    op.drop_table("tracker_runs")
