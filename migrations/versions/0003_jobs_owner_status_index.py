"""jobs (owner_id, status) index: the per-owner cap counts an owner's unfinished jobs per submit

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 08:10:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_id_status", "jobs", ["owner_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_id_status", table_name="jobs")
