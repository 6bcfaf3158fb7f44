"""checkpoints.key: rows hold the object's key in the artifact store, not a node's path;
job_events (kind, id) index for the store's /metrics gauges

``uri`` (an absolute path on the worker that wrote it, or a file:// URL) becomes ``key``,
``<job>/<step>.pt`` relative to the store (ACCUM_ARTIFACTS_URL); the files were always written
at ``<artifacts dir>/<job>/<step>.pt``, so the key is derived from the row's own job and step.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 01:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None



def _key_expression() -> sa.ColumnElement[str]:
    job_id, step = sa.column("job_id", sa.String), sa.column("step", sa.Integer)
    return job_id + "/" + sa.cast(step, sa.String) + ".pt"


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:  # SQLite renames by copying
        batch.alter_column("uri", new_column_name="key", existing_type=sa.Text())
    op.execute(sa.table("checkpoints", sa.column("key")).update().values(key=_key_expression()))
    op.create_index("ix_job_events_kind_id", "job_events", ["kind", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_events_kind_id", table_name="job_events")
    # A relative uri is read relative to the artifacts directory by the older API.
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("key", new_column_name="uri", existing_type=sa.Text())
