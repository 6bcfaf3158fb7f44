"""job_attempts.cause: why an attempt's process died (exit signal or code, the OOM killer)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 13:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_attempts", sa.Column("cause", sa.Text(), nullable=True))


def downgrade() -> None:
    # In place, not batch mode (SQLite >= 3.35 drops a column in place; see 0008's downgrade).
    op.drop_column("job_attempts", "cause")
