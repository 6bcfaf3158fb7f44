"""jobs.enqueued_at: when a queued job's broker message was last sent (lost-message rescue)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 06:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite cannot drop columns in place on every version; a no-op elsewhere.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("enqueued_at")
