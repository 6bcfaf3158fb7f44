"""Public JSON shapes of the API (response models), read from store rows by pydantic
(`from_attributes`): `JobPublic.model_validate(job)`. What a row may hold empty (NULL
JSON columns) is normalised by the validators here, so routes stay guard / do / return.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, Self

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from services.jobdb.nonfinite import Label, label, split_latest
from services.jobdb.status import JobStatus
from services.spec.job import Duration, stored
from services.spec.world import world_of

# Steps and ids are INTEGER columns (32-bit on PostgreSQL): larger query values are refused
# as 422 instead of overflowing in the driver.
MAX_INT32 = 2**31 - 1

EPOCH_DOC = (
    "0-based index of the epoch (the first epoch is 0); the CLI and the dashboard show it "
    "counted from 1"
)
NONFINITE_DOC = (
    "NaN, inf or -inf when the value is not a finite number (`value` is null then: JSON has "
    "no such numbers); absent otherwise"
)


def empty_if_null(value: Any) -> Any:
    """A JSON column the row holds as NULL (or empty) is answered as `{}`."""
    return value or {}


class Progress(BaseModel):
    epoch: int = Field(0, description=EPOCH_DOC)
    optimizer_step: int = 0
    total_optimizer_steps: int | None = None

    # The worker writes the counts as it goes: a job not yet started has none, or nulls.
    _zero_if_null = field_validator("epoch", "optimizer_step", mode="before")(
        lambda count: count or 0
    )


class MicroBatchChoice(BaseModel):
    """What `micro_batch_size: "auto"` chose at the job's first attempt; every later attempt
    (a resume, a hand-back) trains with it."""

    micro_batch_size: int = Field(description="m: samples per forward/backward on each rank")
    accumulation_steps: int = Field(description="N: micro-batches per optimizer step on each rank")


class NonFiniteStop(BaseModel):
    """Where a run stopped on a non-finite value (`on_nonfinite: fail`, or too many skips)."""

    step: int = Field(description="The optimizer step whose window was not finite")
    metric: str = Field(description="`loss` or `grad_norm`")
    value: Label


class JobError(BaseModel):
    type: str
    message: str
    reason: str | None = Field(
        None, description="Why the service ended the job: `timeout` or `poison` (else null)"
    )
    nonfinite: NonFiniteStop | None = Field(
        None, description="The non-finite value that stopped the run, and its step (else null)"
    )


class WorkerInfo(BaseModel):
    name: str | None = Field(None, description="The worker's Celery node name (`--hostname`)")
    host: str | None
    gpu: str | None


class World(BaseModel):
    """The ranks a job trains on, read from its spec with the spec's defaults filled in (a
    stored spec leaves out what a single-node job does not use): the one place a client reads
    them from, rather than restating the defaults."""

    gpus: int = Field(description="GPUs per node (spec gpus; 0: the CPU, one process)")
    nodes: int = Field(description="Nodes (spec nodes; 1 for a single-node job)")
    min_nodes: int = Field(description="The fewest nodes it trains on (spec min_nodes)")
    ranks: int = Field(description="Ranks of one optimizer step: nodes x max(gpus, 1)")


def world_of_spec(spec: dict[str, Any]) -> World:
    gpus, nodes = int(stored(spec, "gpus")), int(stored(spec, "nodes"))
    return World(gpus=gpus, nodes=nodes, min_nodes=int(stored(spec, "min_nodes")), ranks=world_of(gpus, nodes))


class NodePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    node_rank: int = Field(description="0 leads: it holds the lease and opens the rendezvous")
    worker: str = Field(description="The worker's Celery node name")
    host: str | None
    gpu: str | None


class AttemptPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempt: int = Field(description="1 for the first start of the job, 2 for the next, ...")
    worker: str | None = Field(description="The worker's Celery node name")
    host: str | None
    gpu: str | None
    started_at: datetime
    ended_at: datetime | None
    outcome: Literal["running", "succeeded", "failed", "cancelled", "handed_back", "store_fault",
                     "node_lost", "hung", "lost"] = Field(
        description="running while it runs; handed_back: its worker shut down and gave the job "
        "back; store_fault: the artifact store failed it and the job was queued again with a "
        "restart counted; node_lost: a node of its multi-node gang was lost and the job was "
        "queued again with a restart counted; hung: a rank made no progress past "
        "ACCUM_COLLECTIVE_TIMEOUT_S plus a margin (its event names the node and rank) and the job "
        "was queued again with a restart counted; lost: its lease expired (the worker died or was "
        "cut off)"
    )
    resume_step: int | None = Field(description="The checkpoint step it started from; null: the start")
    end_step: int | None = Field(description="The optimizer step it had reached when it ended")
    steps_done: int | None = Field(
        None, description="Optimizer steps this attempt trained (so far, while it runs)"
    )
    cause: str | None = Field(
        None, description="How its process died, when its worker saw it die (a prefork child): "
        "e.g. `killed by signal 9 (SIGKILL)`, `out of memory (the kernel's OOM killer): ...`"
    )
    phases: dict[str, float] | None = Field(
        None, description="Where the attempt's time went, in seconds, in order, as its worker "
        "timed it: claim, admit (the spec checked again), build (data, model, store and trackers "
        "opened), checks (the first-window exactness check), train, final_writes, tracker_end, "
        "finish; a phase left out added its time to the next. Null while it runs"
    )

    _running_if_open = field_validator("outcome", mode="before")(
        lambda outcome: outcome or "running"
    )

    @model_validator(mode="after")
    def _steps_done(self) -> Self:
        if self.end_step is not None:
            self.steps_done = max(self.end_step - (self.resume_step or 0), 0)
        return self


class Exactness(BaseModel):
    status: Literal["passed", "failed", "pending", "not_checked"] = Field(
        default="not_checked", description="passed: a window was compared with its big batch where "
        "a wrong weighting would have shown, and they agree; failed: they differ; pending: compared "
        "only where every weighting agrees (one micro-batch, rows of equal length), checking later "
        "windows; not_checked: see note")
    checked: bool = Field(description="whether a window was compared with its big batch and a verdict given")
    rel_error: float | None = Field(
        default=None, description="relative error of the first window's accumulated gradient against "
        "the big batch's (fp32, eval mode); null when not checked or not finite")
    tolerance: float | None = None
    passed: bool | None = Field(default=None, description="rel_error <= tolerance; null when not checked")
    note: str = Field(default="", description="the check's message: the likely cause and fix on a "
                      "failure, why it did not run otherwise")


def exactness(spec: dict[str, Any], event: Any | None) -> Exactness:
    """The job's exactness check, from its latest ``exactness_check`` event (or why none)."""
    if event is None:
        mode = spec.get("verify_window", True)
        note = "verify_window is false: not checked" if mode is False else "not checked yet"
        return Exactness(checked=False, note=note)
    data = event.data or {}
    rel = data.get("rel_error")
    passed = data.get("passed")
    # accumcore's status (its "skipped" is not_checked here); events written before it had
    # one: a verdict is passed or failed.
    status: Literal["passed", "failed", "pending", "not_checked"] = "not_checked"
    if data.get("status") == "pending":
        status = "pending"
    elif passed is not None:
        status = "passed" if passed else "failed"
    return Exactness(
        status=status,
        checked=passed is not None,
        rel_error=float(rel) if isinstance(rel, int | float) and math.isfinite(rel) else None,
        tolerance=data.get("tolerance"),
        passed=data.get("passed"),
        note=event.message,
    )


RANK_PEAK = "peak_memory_bytes_rank"


def sharing_strategy(spec: dict[str, Any]) -> Literal["ddp", "fsdp"] | None:
    """How a job's ranks share its model: the spec's strategy (ddp when left out) for more than
    one rank (gpus > 1, or several nodes), fsdp for one GPU with CPU offload; None for one
    process."""
    strategy, gpus, nodes = stored(spec, "strategy"), stored(spec, "gpus"), stored(spec, "nodes")
    if not isinstance(gpus, int) or not isinstance(nodes, int):
        return None
    if strategy == "fsdp" and gpus >= 1:
        return "fsdp"
    return "ddp" if world_of(gpus, nodes) > 1 else None


def memory_levers(spec: dict[str, Any]) -> list[str]:
    """The memory levers the spec turns on beside accumulation, as the job view shows them."""
    levers = []
    if checkpointing := spec.get("activation_checkpointing"):
        every = checkpointing.get("every", 1) if isinstance(checkpointing, dict) else 1
        levers.append("activation_checkpointing" + (f" (every {every})" if every != 1 else ""))
    if isinstance(peft := spec.get("peft"), dict):
        merge = ", merge" if peft.get("merge") else ""
        levers.append(f"{peft.get('method', 'lora')} (r {peft.get('r')}, alpha {peft.get('alpha')}{merge})")
    if (spec.get("optimizer") or {}).get("name") == "adamw8bit":
        levers.append("adamw8bit")
    return levers


def per_rank(latest: dict[str, Any], prefix: str) -> list[float | None] | None:
    """The metrics ``<prefix>0``, ``<prefix>1``, ... as a list by rank; a one-process job (no
    per-rank metrics) is rank 0, its ``<prefix>`` less the ``_rank``; None without either."""
    ranks = {int(name[len(prefix):]): value for name, value in latest.items()
             if name.startswith(prefix) and name[len(prefix):].isdigit()}
    if not ranks:
        alone = latest.get(prefix.removesuffix("_rank"))
        return [alone] if isinstance(alone, int | float) else None
    return [ranks.get(r) for r in range(max(ranks) + 1)]


class TrackerRunPublic(BaseModel):
    """The job's run in one experiment tracker."""

    model_config = ConfigDict(from_attributes=True)

    tracker: str = Field(description="mlflow, tensorboard or wandb")
    run_id: str | None = Field(description="The run's id in the tracker (tensorboard: the job's "
                               "folder under <artifacts>/tensorboard); null until the worker opened it")
    url: str | None = Field(description="A link to the run, where the tracker has a web address")
    delivered_step: int = Field(description="The last optimizer step the tracker has every point "
                                "of; -1: none yet")
    pending: bool = Field(
        validation_alias=AliasChoices("undelivered", "pending"),
        description="Points wait for the tracker to be reachable again (the job_events say why)",
    )

    _pending = field_validator("pending", mode="before")(lambda error: bool(error))


# `owner`, `exactness`, `trackers` and `queue_position` are not attributes of the row:
# `services/api/job_view.py` sets them, for the /v1/jobs routes and the stream's `status`
# messages alike. (A docstring here
# would become the schema's description in the OpenAPI document.)
class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str | None
    tags: list[str] = Field(default_factory=list, description="The owner's labels, sorted")
    notes: str | None = Field(None, description="The owner's notes")
    status: JobStatus
    spec: dict[str, Any]
    effective_batch_size: int | None
    micro_batch_chosen: MicroBatchChoice | None = Field(
        None, description='micro_batch_size "auto": the m and N its first attempt chose; null '
        "before that, and for a fixed micro_batch_size"
    )
    progress: Progress
    attempts: list[AttemptPublic] = Field(
        validation_alias=AliasChoices("attempt_list", "attempts"),
        description="Every start of the job by a worker, oldest first",
    )
    error: JobError | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    latest_metrics: dict[str, Any] = Field(
        description="The latest value of each metric; null where it is not finite "
        "(see nonfinite_metrics)"
    )
    nonfinite_metrics: dict[str, Label] = Field(
        default_factory=dict,
        description="The latest_metrics that are NaN, inf or -inf, by name (a diverged run)",
    )
    queue: str
    queue_position: int | None = Field(
        None, description="While queued: 1 = the next job its queue's workers take"
    )
    worker: WorkerInfo | None
    owner: str | None = Field(None, description="The owner's name")
    exactness: Exactness | None = Field(
        default=None, description="The first-window exactness check (spec verify_window), in the "
        "answers about one job and the stream's status messages; not in listings"
    )
    trackers: list[TrackerRunPublic] | None = Field(
        default=None, description="The job's runs in the experiment trackers its spec names, "
        "with links; in the answers about one job, not in listings"
    )
    nodes: list[NodePublic] | None = Field(
        default=None, description="Multi-node jobs (spec nodes > 1): the worker of each node of "
        "the current or last attempt, by node rank (while its gang forms, those that joined so "
        "far); in the answers about one job, not in listings"
    )

    world: World | None = Field(
        default=None, description="The ranks it trains on: gpus, nodes, min_nodes from its spec "
        "(defaults filled in) and the ranks of one optimizer step"
    )
    strategy: Literal["ddp", "fsdp"] | None = Field(
        default=None, description='How the ranks share the model (spec strategy): "ddp" '
        'replicas or "fsdp" shards; null for a one-process job'
    )
    levers: list[str] = Field(
        default_factory=list, description="The memory levers the spec turns on beside accumulation: "
        'activation_checkpointing, lora (peft), adamw8bit; e.g. ["activation_checkpointing", "lora (r 8, alpha 16)"]'
    )
    peak_memory_bytes_per_rank: list[float | None] | None = Field(
        default=None, description="Each rank's peak device memory at the latest optimizer step, "
        "by rank (the metrics peak_memory_bytes_rank{r}; a one-process job's peak_memory_bytes as rank 0); "
        "null off CUDA (the allocator's peak is CUDA's; a CPU job's memory is the system metrics' RSS)"
    )

    _empty_if_null = field_validator("progress", "latest_metrics", mode="before")(empty_if_null)

    @field_validator("error", mode="before")
    @classmethod
    def _error(cls, error: Any) -> Any:
        # The worker stores what it caught as a free-form dict: show its type and message.
        if not error:
            return None
        reason = error.get("reason")
        return {
            "type": str(error.get("type", "Error")),
            "message": str(error.get("message", "")),
            "reason": None if reason is None else str(reason),
            "nonfinite": error.get("nonfinite"),
        }

    @model_validator(mode="after")
    def _split_nonfinite(self) -> Self:
        # The store keeps a non-finite latest value as its label ("NaN", "inf", "-inf"):
        # answered as null, with the label in nonfinite_metrics.
        self.latest_metrics, labels = split_latest(self.latest_metrics)
        self.nonfinite_metrics = {**labels, **self.nonfinite_metrics}
        # The window that stopped the run logged no metrics: its value is the latest one.
        if self.error is not None and (stop := self.error.nonfinite) is not None:
            self.latest_metrics[stop.metric] = None
            self.nonfinite_metrics[stop.metric] = stop.value
        self.world = world_of_spec(self.spec)
        self.strategy = sharing_strategy(self.spec)
        self.levers = memory_levers(self.spec)
        self.peak_memory_bytes_per_rank = per_rank(self.latest_metrics, RANK_PEAK)
        # The attempt that runs now has trained as far as the job's progress.
        for attempt in self.attempts:
            if attempt.end_step is None and attempt.outcome == "running":
                attempt.steps_done = max(self.progress.optimizer_step - (attempt.resume_step or 0), 0)
        return self


class OwnerPublic(BaseModel):
    name: str
    is_admin: bool
    # The servers' paths, so only admins are told them (as in the 422 of a refused data_root);
    # the dashboard offers them in the submit form's data_root field.
    data_roots: list[str] | None = Field(
        default=None, description="the allowed data_root directories (ACCUM_DATA_ROOTS); admins only"
    )


class TokenPublic(BaseModel):
    """A token as listed: never the token itself (it is stored as a hash), only its prefix."""

    owner: str
    prefix: str = Field(description="The first 12 characters: enough to tell tokens apart")
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(
        default=None, description="When a request last presented it, to the minute; null: never"
    )


class TokenList(BaseModel):
    items: list[TokenPublic]


class TokenCreated(TokenPublic):
    token: str = Field(description="The new bearer token, shown this once: store it now")


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    message: str
    data: dict[str, Any]
    attempt: int
    created_at: datetime

    _empty_if_null = field_validator("data", mode="before")(empty_if_null)


class EventList(BaseModel):
    items: list[EventPublic]


class LogLinePublic(BaseModel):
    """One line a job's training process printed (``stream``: stdout, stderr, or ``accum``
    for the capture's own notes: lines cut or dropped at the bounds)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt: int
    stream: str
    line: str
    created_at: datetime


class LogList(BaseModel):
    items: list[LogLinePublic]


class MetricPoint(BaseModel):
    name: str
    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    value: float | None
    ts: datetime
    nonfinite: Label | None = Field(None, description=NONFINITE_DOC)


class MetricPointDict(TypedDict):
    """A MetricPoint as a plain dict: the metrics page and the SSE stream serialise these
    without building models (the hot path of a dashboard)."""

    name: str
    step: int
    epoch: int | None
    value: float | None
    ts: datetime
    nonfinite: NotRequired[Label]


def metric_point(
    name: str, step: int, epoch: int | None, value: float | None, ts: Any
) -> MetricPointDict:
    """One point as answered: a NaN or infinity is a JSON null with its `nonfinite` label."""
    item: MetricPointDict = {"name": name, "step": step, "epoch": epoch, "value": value, "ts": ts}
    # The finite case first, in one comparison (a NaN fails it): a page has a thousand points.
    if value is None or not -math.inf < value < math.inf:
        item["nonfinite"] = label(value)  # type: ignore[typeddict-item]
    return item


class MetricPage(BaseModel):
    items: list[MetricPoint]
    next_cursor: str | None


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    size_bytes: int
    sha256: str
    created_at: datetime
    metrics: dict[str, Any]
    is_best: bool

    _empty_if_null = field_validator("metrics", mode="before")(empty_if_null)


TAG_PATTERN = r"^[A-Za-z0-9_.:-]{1,40}$"
MAX_TAGS = 20
Tag = Annotated[str, Field(pattern=TAG_PATTERN, description="letters, digits, _ . : -; 1 to 40")]


class JobEdit(BaseModel):
    """`PATCH /v1/jobs/{id}` body: what to change of a job's own metadata (any of them)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=200, description="A new name")
    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS,
                                   description="The job's tags, replacing the old ones ([] clears them)")
    notes: str | None = Field(None, max_length=10_000, description='Notes ("" clears them)')


class ResumeRequest(BaseModel):
    """`POST /v1/jobs/{id}/resume` body (optional): where to start again."""

    model_config = ConfigDict(extra="forbid")

    from_step: int | None = Field(None, ge=0, le=MAX_INT32,
                                  description="Resume from the checkpoint at this step "
                                  "(later checkpoints are dropped)")
    from_scratch: bool = Field(False, description="Start over from step 0 (checkpoints dropped)")
    timeout: Duration = Field(
        None, description='A new timeout (seconds, or "90m", "12h", "7d"; at most '
        "ACCUM_MAX_JOB_SECONDS) replacing the spec's; either way the run time counts from 0 again"
    )

    @model_validator(mode="after")
    def _one_of(self) -> ResumeRequest:
        if self.from_scratch and self.from_step is not None:
            raise ValueError("give from_step or from_scratch, not both")
        return self


class CheckpointList(BaseModel):
    items: list[CheckpointPublic]


class CatalogList(BaseModel):
    items: list[dict[str, Any]]


WorkerState = Literal["idle", "busy", "lost", "stopped"]


# Owners see name, queues, devices and state; admins every field (`routes/workers.py`).
class WorkerPublic(BaseModel):
    name: str = Field(description="The worker's Celery node name (`--hostname`)")
    queues: list[str]
    devices: list[dict[str, Any]] = Field(
        description='GPUs (`{"kind": "gpu", "index", "name", "memory_bytes"}`) or the CPU '
        '(`{"kind": "cpu", "name", "cores"}`)'
    )
    state: WorkerState = Field(
        description="busy or idle; lost when not heard from for the lease timeout; stopped "
        "after a clean shutdown"
    )
    host: str | None = None
    pid: int | None = None
    gpus: int | None = None
    models: list[str] | None = None
    datasets: list[str] | None = None
    plugins: list[str] | None = None
    versions: dict[str, str] | None = None
    accum_version: str | None = None
    started_at: datetime | None = None
    last_seen: datetime | None = None
    stopped_at: datetime | None = None
    current_job: str | None = None
    heartbeat_age_s: float | None = None


class WorkerList(BaseModel):
    items: list[WorkerPublic]
