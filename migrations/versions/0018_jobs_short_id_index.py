"""jobs: an index of each owner's short ids (the id's last 6 characters), for the lookup of
a short id and the check that a new job's is free (services.jobdb.job_ids, jobs.create_job)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 16:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The expression as services.jobdb.models.short_id_column spells it (SQLite and PostgreSQL alike).
    op.create_index("ix_jobs_owner_id_short", "jobs", ["owner_id", sa.text("substr(id, 21, 6)"), "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_id_short", table_name="jobs")
