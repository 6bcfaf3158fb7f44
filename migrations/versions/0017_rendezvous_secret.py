"""job_attempts.rendezvous_secret: what a multi-node attempt's ranks present to join its store

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_attempts", sa.Column("rendezvous_secret", sa.String(128), nullable=True))


def downgrade() -> None:
    # In place, not batch mode (SQLite >= 3.35 drops a column in place; see 0008's downgrade).
    op.drop_column("job_attempts", "rendezvous_secret")
