"""jobs.run_seconds: run time used since submit or the last resume, against the timeout

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("run_seconds", sa.Double(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    # In place, not batch mode: batch mode copies `jobs` on SQLite, and dropping the old table
    # would cascade to every checkpoint, metric and event row (see 0008's downgrade).
    op.drop_column("jobs", "run_seconds")
