"""SQLAlchemy 2 models: owners, API tokens, jobs, job attempts, job events, job output
(log lines), metrics, checkpoints, workers.

The schema is created by Alembic (``migrations/``); ``tests/jobdb/test_migrations.py`` checks
that autogenerate finds no difference between these models and the migrations.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    literal_column,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from services.jobdb.status import JobStatus
from services.jobdb.types import ID_LEN, SHORT_LEN, UTCDateTime, new_id, utcnow

# Named constraints: Alembic's batch mode on SQLite can only alter constraints with names.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}



class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Owner(Base):
    __tablename__ = "owners"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiToken(Base):
    """A bearer token, stored as its sha256 (never in clear) plus a short prefix for display.
    A revoked token keeps its row (``revoked_at`` set): who had which token, and until when."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # When a request last presented it, to the minute (tokens.LAST_USED_RESOLUTION_S).
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Job(Base):
    """One training job. ``id`` is time-ordered, so ``ORDER BY id DESC`` is newest first.

    ``attempts`` counts the times a worker started the job (1 while its first attempt runs);
    it is also the ``attempt`` written on metrics, events and checkpoints of that run.
    ``restarts`` counts automatic restarts after a lost lease since the job was created or last
    resumed by a user; the reaper fails the job once it would exceed ``max_restarts``.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key"),
        CheckConstraint(
            f"status IN ({', '.join(repr(str(status)) for status in JobStatus)})",
            name="status",
        ),
        Index("ix_jobs_owner_id_id", "owner_id", "id"),
        # The per-owner cap counts an owner's unfinished jobs on every submit (store.quotas).
        Index("ix_jobs_owner_id_status", "owner_id", "status"),
        Index("ix_jobs_status_lease_expires_at", "status", "lease_expires_at"),
        # A queued job's place in line (store.queue_order): its queue's queued jobs by
        # priority, then age.
        Index("ix_jobs_queue_status_priority_id", "queue", "status", "priority", "id"),
    )

    id: Mapped[str] = mapped_column(String(26), primary_key=True, default=new_id)
    owner_id: Mapped[int] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    queue: Mapped[str] = mapped_column(String(100), default="default")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    max_restarts: Mapped[int] = mapped_column(Integer, default=3)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    effective_batch_size: Mapped[int | None] = mapped_column(Integer)
    latest_metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_host: Mapped[str | None] = mapped_column(String(200))
    worker_gpu: Mapped[str | None] = mapped_column(String(200))
    resume_step: Mapped[int | None] = mapped_column(Integer)
    # The Celery node name (--hostname) of the worker that runs or last ran the job.
    worker_name: Mapped[str | None] = mapped_column(String(200))
    # 0 low, 1 normal, 2 high (services.jobdb.queue_order.PRIORITIES): the broker delivers
    # higher first where it can, and a queued job's place in line counts it.
    priority: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Seconds its attempts ran since it was submitted or last resumed by a user, added as each
    # attempt ends: the next attempt runs for what is left of the spec's ``timeout``.
    run_seconds: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    # The owner's own labels, stored as ",a,b," (sorted, each once) so that one LIKE finds a
    # tag on every database; read them as the list `tags`.
    tag_text: Mapped[str] = mapped_column("tags", String(1000), default="", server_default="")
    notes: Mapped[str | None] = mapped_column(Text)
    # {"micro_batch_size": m, "accumulation_steps": N}: what ``micro_batch_size: "auto"`` chose
    # at the job's first attempt, reused by every later one (services.worker.micro_batch).
    micro_batch_chosen: Mapped[dict[str, int] | None] = mapped_column(JSON(none_as_null=True))
    # When a broker message for this job was last sent (or attempted) while it was queued:
    # the reaper re-sends a queued job's message once this is older than
    # ACCUM_REQUEUE_AFTER_S, in case the first one was lost (broker down at submit time).
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    @property
    def tags(self) -> list[str]:
        return [t for t in self.tag_text.split(",") if t]

    # Every start of the job, oldest first (``attempts`` above is their count).
    attempt_list: Mapped[list[JobAttempt]] = relationship(
        order_by="JobAttempt.attempt", lazy="select", viewonly=True
    )

    # The job's runs in experiment trackers (services.worker.trackers), by tracker name.
    tracker_runs: Mapped[list[TrackerRun]] = relationship(
        order_by="TrackerRun.tracker", lazy="select", viewonly=True
    )

    @property
    def worker(self) -> dict[str, str | None] | None:
        """Where the job runs or last ran (``name``, ``host``, ``gpu``); None before a worker
        took it."""
        if not (self.worker_host or self.worker_gpu):
            return None
        return {"name": self.worker_name, "host": self.worker_host, "gpu": self.worker_gpu}


# A job's short id (its id's last SHORT_LEN characters: services.jobdb.job_ids), indexed per
# owner, so that finding one (and checking a new job's is free) reads a few index entries, not
# the owner's every job: at 10,000 of an owner's jobs, 4.6 -> 0.7 ms on SQLite and 17.5 -> 1.7 ms
# on PostgreSQL here (under load). The query must spell the expression as the index does:
# literal arguments, not bound ones.
short_id_column = func.substr(Job.id, literal_column(str(ID_LEN - SHORT_LEN + 1)), literal_column(str(SHORT_LEN)))
Index("ix_jobs_owner_id_short", Job.owner_id, short_id_column, Job.id)


class JobAttempt(Base):
    """One start of a job by a worker, and how it ended (``outcome`` null while it runs):
    ``succeeded``, ``failed``, ``cancelled``, ``handed_back`` (its worker shut down),
    ``store_fault`` (the artifact store failed it: queued again), ``node_lost`` (a node of its
    multi-node gang was lost: queued again), ``hung`` (a rank made no progress past its deadline:
    queued again) or ``lost`` (its lease expired). ``end_step`` is the optimizer step it had reached. ``cause``:
    why its process died, when the worker saw it die (``services.worker.process_death``)."""

    __tablename__ = "job_attempts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str | None] = mapped_column(String(200))
    host: Mapped[str | None] = mapped_column(String(200))
    gpu: Mapped[str | None] = mapped_column(String(200))
    resume_step: Mapped[int | None] = mapped_column(Integer)
    end_step: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str | None] = mapped_column(String(20))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cause: Mapped[str | None] = mapped_column(Text)
    # Where the attempt's time went, as its worker timed it: {"claim": s, "admit": s, "build": s,
    # "checks": s, "train": s, "final_writes": s, "tracker_end": s, "finish": s} in that order
    # (``services.worker.phases``); written with its outcome, null before (or from an older worker).
    phases: Mapped[dict[str, float] | None] = mapped_column(JSON(none_as_null=True))
    # A multi-node attempt's rendezvous endpoint (torch.distributed's TCPStore), chosen by the
    # worker of node rank 0 on its advertised address (services.worker.gang); null otherwise.
    master_addr: Mapped[str | None] = mapped_column(String(200))
    master_port: Mapped[int | None] = mapped_column(Integer)
    # What the attempt's ranks present to join that store (services.worker.rendezvous): the
    # other nodes' workers read it here; never in an API answer, an event or a log.
    rendezvous_secret: Mapped[str | None] = mapped_column(String(128))


class AttemptMember(Base):
    """One node of a multi-node (``nodes: n``) attempt: the worker that joined its gang as
    ``node_rank`` (0 leads: it holds the job's lease and opens the rendezvous). Written while
    the gang forms (``services.jobdb.gangs``), kept as the record of where each node ran."""

    __tablename__ = "attempt_members"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "worker"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str] = mapped_column(String(200))  # the Celery node name
    worker_id: Mapped[str] = mapped_column(String(200))  # its lease id (name/attempt token)
    host: Mapped[str | None] = mapped_column(String(200))
    gpu: Mapped[str | None] = mapped_column(String(200))
    joined_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class FormingGang(Base):
    """The one gang being formed on a queue, if any: the primary key on ``queue`` is what keeps
    two gang jobs from each holding part of a queue's workers (``services.jobdb.gangs``)."""

    __tablename__ = "forming_gangs"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobEvent(Base):
    """The lifecycle log of a job (kinds listed in docs/architecture.md)."""

    __tablename__ = "job_events"
    __table_args__ = (
        Index("ix_job_events_job_id_id", "job_id", "id"),
        Index("ix_job_events_kind_id", "kind", "id"),  # /metrics: the latest checkpoint, faults
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(50))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobLogLine(Base):
    """One line a job's training process printed (stdout or stderr, its warnings and library
    log messages), captured by the worker per attempt (``services/worker/output_capture.py``):
    at most ``ACCUM_LOG_MAX_LINES_PER_ATTEMPT`` lines each of at most
    ``ACCUM_LOG_MAX_LINE_BYTES``, secrets of the worker's environment redacted."""

    __tablename__ = "job_logs"
    __table_args__ = (Index("ix_job_logs_job_id_attempt_id", "job_id", "attempt", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(6))  # stdout, stderr, or accum (the capture's own)
    line: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Metric(Base):
    """One value of one metric at one optimizer step.

    The primary key (job_id, name, step) is the uniqueness rule (a resumed attempt overwrites
    its predecessor's rows, so each step appears once) and the index for reading one metric in
    step order. ``value`` is NULL for a NaN (SQLite cannot hold one) and +-inf as themselves
    (services/jobdb/nonfinite.py).
    """

    __tablename__ = "metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    epoch: Mapped[int | None] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Double)
    ts: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MetricBlock(Base):
    """The lowest and highest value of one metric over one block of ``BLOCK_STEPS`` steps.

    Maintained by ``metrics.write_metrics`` / ``delete_metrics_after`` (recomputed from the
    rows of every block they touch, so it is always exact) so that downsampling a long curve
    reads one row per block instead of every point. NULL values are not counted.
    """

    __tablename__ = "metric_blocks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    block: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    min_step: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float] = mapped_column(Double)
    max_step: Mapped[int] = mapped_column(Integer)
    max_value: Mapped[float] = mapped_column(Double)


class Checkpoint(Base):
    """A checkpoint's record; the object lives at ``key`` (``<job>/<step>.pt``) in the artifact
    store (``services.artifacts``), so the row means the same on every node."""

    __tablename__ = "checkpoints"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    epoch: Mapped[int | None] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    is_best: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class TrackerRun(Base):
    """A job's run in one experiment tracker (MLflow, TensorBoard, W&B): one per job and
    tracker, continued by every attempt. ``delivered_step`` is the last optimizer step whose
    points the tracker has (a resumed attempt sends only later ones); ``undelivered`` is the
    last delivery error while the tracker is unreachable, null once it has everything."""

    __tablename__ = "tracker_runs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tracker: Mapped[str] = mapped_column(String(20), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(200))
    url: Mapped[str | None] = mapped_column(Text)
    delivered_step: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    undelivered: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class AuthFailure(Base):
    """One failed token check by a client address, kept for one failure window: every API
    process records its failures here, so the per-address limit counts them all."""

    __tablename__ = "auth_failures"
    __table_args__ = (
        Index("ix_auth_failures_address_at", "address", "at"),
        Index("ix_auth_failures_at", "at"),  # each write deletes what left the window
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(100))
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class Worker(Base):
    """A worker process as it registered itself (``services.worker.registry``): what it serves
    and can build, renewed every heartbeat. ``stopped_at`` is set on a clean shutdown; a
    worker whose ``last_seen`` is older than the lease timeout is lost (decided when read)."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_last_seen", "last_seen"),)

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(JSON, default=list)
    # [{"kind": "gpu", "index", "name", "memory_bytes"}] or [{"kind": "cpu", "name", "cores"}]
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    models: Mapped[list[str]] = mapped_column(JSON, default=list)
    datasets: Mapped[list[str]] = mapped_column(JSON, default=list)
    plugins: Mapped[list[str]] = mapped_column(JSON, default=list)
    versions: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    accum_version: Mapped[str] = mapped_column(String(50))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
