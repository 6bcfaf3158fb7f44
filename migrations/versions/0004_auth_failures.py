"""auth_failures: failed token checks per client address, shared by every API process

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 11:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_failures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("address", sa.String(length=100), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_failures")),
    )
    op.create_index("ix_auth_failures_address_at", "auth_failures", ["address", "at"])
    op.create_index("ix_auth_failures_at", "auth_failures", ["at"])


def downgrade() -> None:
    op.drop_index("ix_auth_failures_at", table_name="auth_failures")
    op.drop_index("ix_auth_failures_address_at", table_name="auth_failures")
    op.drop_table("auth_failures")
