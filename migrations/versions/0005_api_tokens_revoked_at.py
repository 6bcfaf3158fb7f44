"""api_tokens.revoked_at: revoking a token keeps its row, as an audit trail

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 11:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:  # SQLite drops a column by copying
        batch.drop_column("revoked_at")
