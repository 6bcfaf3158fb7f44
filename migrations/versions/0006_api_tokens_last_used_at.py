"""api_tokens.last_used_at: when a request last presented the token (to the minute)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:  # SQLite drops a column by copying
        batch.drop_column("last_used_at")
