"""jobs.tags and jobs.notes: a job's own metadata, editable after submit (PATCH /v1/jobs/{id})

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Tags as ",a,b,": one LIKE finds a tag on SQLite and PostgreSQL alike, no JSON operators.
    op.add_column("jobs", sa.Column("tags", sa.String(1000), server_default="", nullable=False))
    op.add_column("jobs", sa.Column("notes", sa.Text(), nullable=True))


def downgrade() -> None:
    # In place, not batch mode (see 0010's downgrade).
    op.drop_column("jobs", "notes")
    op.drop_column("jobs", "tags")
