"""job_attempts.phases: where an attempt's time went (claim, build, checks, train, writes ...)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_attempts", sa.Column("phases", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # In place, not batch mode (SQLite >= 3.35 drops a column in place; see 0008's downgrade).
    op.drop_column("job_attempts", "phases")
