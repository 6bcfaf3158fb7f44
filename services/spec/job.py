"""`JobSpec`: what a user submits to train one model, validated before anything is stored.

    from services.spec import parse_spec
    spec = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 16,
                       "accumulation_steps": 4, "epochs": 1,
                       "optimizer": {"name": "sgd", "lr": 0.1}})
    spec.normalised()  # JSON-ready, every default filled; parse_spec(it) gives the same spec

Cross-field rules (exactly one of accumulation_steps / effective_batch_size, exactly one of
epochs / max_steps, divisibility, model x dataset compatibility) are field validators that
read earlier fields, so each error carries the path of the field it is about. Field order
matters for that: gpus comes before the batch fields, model before dataset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from services.catalog import check_compatible, compatible_datasets, model_path
from services.settings import TRACKERS
from services.spec import labels
from services.spec.errors import one_of, spec_error
from services.spec.fields import (
    MAX_STEPS,
    SPEC_CONFIG,
    Bool,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)
from services.spec.levers import ActivationCheckpointing, PeftOptions, check_peft
from services.spec.parts import InitFrom, Optimizer, Scheduler, SchedulerSpec
from services.spec.priority import DEFAULT_PRIORITY, PRIORITIES, Priority
from services.spec.refs import Dataset, Model
from services.spec.sharding import FsdpOptions, Strategy, check_fsdp
from services.spec.world import world_of

# Retention per job: more only fills the store (a job is resumed from its latest checkpoint,
# or from an older one a user picks; a hundred is plenty for that).
MAX_KEEP_CHECKPOINTS = 100

PRECISIONS = ("fp32", "bf16", "fp16")
NONFINITE_POLICIES = ("fail", "skip")  # accumcore.Trainer(on_nonfinite=...)
VERIFY_WINDOW_MODES = (True, False, "warn", "strict")  # accumcore.Trainer(verify_window=...)
MAX_ACCUMULATION_STEPS = 65536
MAX_MICRO_BATCH_SIZE = 1 << 20
MAX_SEED = (1 << 63) - 1
# 10,000 passes over the data is more than any job this service is for; the run's optimizer
# steps are bounded by MAX_STEPS (fields.py) besides, at submit (services.spec.limits).
MAX_EPOCHS = 10_000
# The hard ceiling of max_restarts and gpus; the service's own (ACCUM_MAX_RESTARTS,
# ACCUM_MAX_GPUS) are lower and checked at submit (services.spec.limits).
MAX_RESTARTS = 100
MAX_GPUS = 64
# Worker nodes of one job (`nodes`); the gang forms on one queue's workers.
MAX_NODES = 64
# Steps and batch sizes are 32-bit INTEGER columns in the store (PostgreSQL refuses more,
# SQLite would keep it): larger values are refused here, the same on both backends.
MAX_STORED_INT = 2**31 - 1
QUEUE_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
MAX_QUEUE_LENGTH = 64
MAX_NAME_LENGTH = 200
AUTO = "auto"
# A job's timeout: seconds, or a duration such as "90m", "12h", "7d". The service's own
# maximum (and the default) is ACCUM_MAX_JOB_SECONDS, checked at submit; this is the ceiling.
MAX_TIMEOUT_S = 30 * 24 * 3600
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _verify_window(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value is True or value is False or value in ("warn", "strict"):
        return value
    raise spec_error(
        "not_allowed",
        f"unknown verify_window {value!r}; choose one of: true (fail the job when the first "
        "window's accumulated gradient is not the big batch's), \"warn\" (record it and train "
        "on), \"strict\" (also fail the job when the check cannot run), false (no check)",
        VERIFY_WINDOW_MODES,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _micro_batch(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value == AUTO or (_is_int(value) and 0 < value <= MAX_MICRO_BATCH_SIZE):
        return value
    raise spec_error(
        "micro_batch_size",
        f"micro_batch_size must be an integer from 1 to {MAX_MICRO_BATCH_SIZE} (samples per "
        'forward/backward) or "auto" (the largest that fits and divides effective_batch_size); '
        f"got {value!r}",
    )


def _steps(value: Any, where: str) -> int:
    if _is_int(value) and 1 <= value <= MAX_ACCUMULATION_STEPS:
        return int(value)
    raise spec_error(
        "accumulation_steps",
        f"{where} must be an integer from 1 to {MAX_ACCUMULATION_STEPS} "
        f"(micro-batches per optimizer step); got {value!r}",
    )


def _epoch_key(key: Any) -> int:
    if (
        isinstance(key, str)
        and key.isascii()
        and key.isdigit()
        and len(key) <= len(str(MAX_EPOCHS))
    ):
        key = int(key)
    if _is_int(key) and 0 <= key <= MAX_EPOCHS:
        return int(key)
    raise spec_error(
        "accumulation_schedule",
        f"accumulation_steps schedule keys are epochs (integers from 0 to {MAX_EPOCHS}), as in "
        f'{{"0": 8, "4": 2}}; got key {key!r}',
    )


def _accumulation(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """N as an int, or an epoch schedule normalised to `{"0": 8, "4": 2}` sorted by epoch."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return _steps(value, "accumulation_steps")
    schedule: dict[int, int] = {}
    for key, steps in value.items():
        epoch = _epoch_key(key)
        if epoch in schedule:
            raise spec_error(
                "accumulation_schedule", f"accumulation_steps schedule names epoch {epoch} twice"
            )
        schedule[epoch] = _steps(steps, f"accumulation_steps[{str(key)!r}]")
    if 0 not in schedule:
        got = ", ".join(str(e) for e in sorted(schedule)) or "none"
        raise spec_error(
            "accumulation_schedule",
            f'accumulation_steps schedule must start at epoch 0, as in {{"0": 8, "4": 2}}; got epochs {got}',
        )
    return {str(epoch): schedule[epoch] for epoch in sorted(schedule)}


def _job_name(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value is None:
        return None
    if (
        isinstance(value, str)
        and value.strip()
        and value.isprintable()
        and len(value) <= MAX_NAME_LENGTH
    ):
        return value.strip()
    raise spec_error(
        "job_name",
        f"name must be printable text of 1 to {MAX_NAME_LENGTH} characters, or left out "
        f"for <model>-<dataset>; got {value!r}",
    )


def _queue(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if (
        isinstance(value, str)
        and len(value) <= MAX_QUEUE_LENGTH
        and re.fullmatch(QUEUE_PATTERN, value)
    ):
        return value
    raise spec_error(
        "queue",
        f"queue must be lowercase letters, digits, '_' or '-', starting with a letter or digit, "
        f'at most {MAX_QUEUE_LENGTH} characters (default "default"); got {value!r}',
    )


def _timeout(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Seconds as an int, from an int or a duration text ("45s", "90m", "12h", "7d")."""
    if value is None:
        return None
    seconds = value if _is_int(value) else None
    if isinstance(value, str) and (match := re.fullmatch(r"\s*(\d{1,9})\s*([smhd])\s*", value)):
        seconds = int(match[1]) * _UNITS[match[2]]
    if seconds is not None and 1 <= seconds <= MAX_TIMEOUT_S:
        return seconds
    raise spec_error(
        "timeout",
        f"timeout must be a duration from 1 s to {MAX_TIMEOUT_S // 86400} days: seconds, or text "
        f'such as "90m", "12h", "7d" (default and maximum: ACCUM_MAX_JOB_SECONDS); got {value!r}',
    )


def _trackers(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Tracker names, each once, in the order given."""
    if not isinstance(value, list):
        raise spec_error(
            "trackers",
            f'trackers must be a list of tracker names, e.g. ["mlflow", "tensorboard"]; got {value!r}',
            TRACKERS,
        )
    for index, name in enumerate(value):
        if name not in TRACKERS:
            raise spec_error(
                "not_allowed",
                f"trackers[{index}]: unknown tracker {name!r}; choose from: {', '.join(TRACKERS)}",
                TRACKERS,
            )
    return list(dict.fromkeys(value))


def _model_name(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value is None or (isinstance(value, str) and 0 < len(value) <= MAX_NAME_LENGTH
                         and value.isprintable() and value.strip() == value):
        return value
    raise spec_error(
        "register_model",
        f"register_model must be an MLflow registered model's name, 1 to {MAX_NAME_LENGTH} "
        f"printable characters without surrounding spaces, or left out; got {value!r}",
    )


# A duration field (the spec's `timeout`, a resume's new one): seconds as an int.
Duration = Annotated[int | str | None, WrapValidator(_timeout)]


def _world(data: Mapping[str, Any]) -> int | None:
    """Ranks of one optimizer step (nodes x gpus; CPU counts one); None when either failed."""
    gpus, nodes = data.get("gpus"), data.get("nodes")
    return None if gpus is None or nodes is None else world_of(gpus, nodes)


def _effective_batches(data: Mapping[str, Any], micro: int, world: int) -> list[int]:
    """The spec's effective batch sizes (one per accumulation schedule entry)."""
    if data["effective_batch_size"] is not None:
        return [int(data["effective_batch_size"])]
    steps = data["accumulation_steps"]
    return [micro * n * world for n in (steps.values() if isinstance(steps, dict) else [steps])]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class JobSpec(BaseModel):
    """A training job: model, data, batch geometry, optimisation, and how to run it."""

    model_config = SPEC_CONFIG

    name: Annotated[str | None, WrapValidator(_job_name)] = None
    tags: Annotated[
        list[str], WrapValidator(labels.tags),
        Field(default_factory=list, description=f"the owner's labels: at most {labels.MAX_TAGS}, "
              f"each 1 to {labels.MAX_TAG_LENGTH} letters, digits or _ . : -; `accum jobs --tag` "
              "filters by them, and the job page edits them"),
    ]
    notes: Annotated[
        str | None, WrapValidator(labels.notes),
        Field(description=f"the owner's notes, at most {labels.MAX_NOTES_LENGTH:,} characters; "
              "searched by `accum jobs --search`, shown and edited on the job page"),
    ] = None
    model: Model
    dataset: Dataset
    gpus: Annotated[
        NonNegativeInt,
        Field(le=MAX_GPUS, description="GPUs to train on (DDP or FSDP when > 1, see strategy); 0 = CPU; see ACCUM_MAX_GPUS"),
    ] = 1
    nodes: Annotated[
        PositiveInt,
        Field(le=MAX_NODES, description="worker nodes the job trains on at once, each with `gpus` "
              "ranks (world size = nodes x gpus); > 1 waits until that many workers of its queue "
              "can start it together"),
    ] = 1
    micro_batch_size: Annotated[int | Literal["auto"], WrapValidator(_micro_batch)]
    accumulation_steps: Annotated[int | dict[str, int] | None, WrapValidator(_accumulation)] = None
    effective_batch_size: Annotated[
        PositiveInt | None, Field(le=MAX_STORED_INT, validate_default=True)
    ] = None
    min_nodes: Annotated[
        PositiveInt | None,
        Field(le=MAX_NODES, validate_default=True,
              description="the fewest nodes the job may run on (default: nodes): a gang that "
              "gathers fewer within ACCUM_GANG_FORM_TIMEOUT_S, or a resume after a lost node, "
              "runs on as many as it has, with N grown to keep the effective batch"),
    ] = None
    epochs: Annotated[PositiveInt, Field(le=MAX_EPOCHS)] | None = None
    max_steps: Annotated[PositiveInt | None, Field(le=MAX_STEPS, validate_default=True)] = None
    optimizer: Optimizer
    scheduler: Scheduler = Field(default_factory=lambda: SchedulerSpec(name="none"))
    precision: Annotated[Literal["fp32", "bf16", "fp16"], one_of("precision", PRECISIONS)] = "fp32"
    strategy: Annotated[
        Strategy,
        Field(description='with gpus > 1: "ddp" (a model replica per rank) or "fsdp" (parameters, '
              "gradients and optimizer states sharded over the ranks; options in fsdp)"),
    ] = "ddp"
    fsdp: Annotated[FsdpOptions | None, Field(validate_default=True)] = None
    grad_clip_norm: PositiveFloat | None = None
    on_nonfinite: Annotated[
        Literal["fail", "skip"],
        one_of("on_nonfinite", NONFINITE_POLICIES),
        Field(description="a window with an inf/NaN loss or gradient: fail the job, or skip its step"),
    ] = "fail"
    verify_window: Annotated[
        bool | Literal["warn", "strict"],
        WrapValidator(_verify_window),
        Field(description="before the first step, compare the first window's accumulated "
              "gradient with the big batch's (fp32, eval mode, relative tolerance 1e-6): true "
              "fails the job when they differ, naming the fix; \"warn\" records it and trains "
              "on; \"strict\" also fails the job when the check cannot run; false skips the check. "
              "A window that could not differ (one micro-batch, rows of equal length) is "
              "'pending' and later windows are checked"),
    ] = True
    seed: Annotated[NonNegativeInt, Field(le=MAX_SEED)] = 0
    checkpoint_every: Annotated[
        PositiveInt, Field(le=MAX_STORED_INT, description="optimizer steps between checkpoints")
    ] = 100
    keep_checkpoints: Annotated[
        PositiveInt,
        Field(le=MAX_KEEP_CHECKPOINTS, description="latest checkpoints kept (plus the best by val_loss)"),
    ] = 3
    eval_every: Annotated[
        PositiveInt | None,
        Field(le=MAX_STORED_INT, description="optimizer steps between evaluations, besides the "
              "one at each epoch end (always made); null = at each epoch end only"),
    ] = None
    queue: Annotated[str, Field(pattern=QUEUE_PATTERN), WrapValidator(_queue)] = "default"
    timeout: Annotated[
        Duration,
        Field(
            description="run time, over all its attempts since submit or the last resume, after "
            "which the job is checkpointed and fails (reason timeout): seconds or \"90m\", "
            '"12h", "7d"; default and maximum ACCUM_MAX_JOB_SECONDS'
        ),
    ] = None
    max_restarts: Annotated[
        NonNegativeInt, Field(le=MAX_RESTARTS, description="at most ACCUM_MAX_RESTARTS (10)")
    ] = 3
    priority: Annotated[
        Priority,
        one_of("priority", PRIORITIES),
        Field(description="queue order: higher first; high is for admins"),
    ] = DEFAULT_PRIORITY
    compile: Bool = False
    fast_path: Bool = True
    data_on_device: Bool = False
    init_from: InitFrom | None = None
    trackers: Annotated[
        list[str],
        WrapValidator(_trackers),
        Field(description="experiment trackers that receive the job's parameters, metrics and "
              "final checkpoint: any of mlflow, tensorboard, wandb that this service offers "
              "(ACCUM_TRACKERS)"),
    ] = Field(default_factory=list)
    activation_checkpointing: Annotated[
        ActivationCheckpointing,
        Field(description='recompute activations in the backward instead of keeping them: true '
              '(every transformer block; other models: every top-level child) or {"every": k}; '
              "exact: the recompute draws the same dropout masks"),
    ] = None
    peft: Annotated[
        PeftOptions | None,
        Field(description='LoRA adapters on a frozen hf: model: {"method": "lora", "r", "alpha", '
              '"dropout", "target_modules", "merge"}; checkpoints hold the adapters'),
    ] = None
    register_model: Annotated[
        str | None,
        WrapValidator(_model_name),
        Field(description="with trackers: mlflow, the final checkpoint becomes a version of "
              "this MLflow registered model (else it is the run's artifact)"),
    ] = None

    @field_validator("dataset")
    @classmethod
    def _compatible_with_model(cls, dataset: Any, info: ValidationInfo) -> Any:
        model = info.data.get("model")
        if model is None:  # the model failed validation and has its own error
            return dataset
        try:
            reason = check_compatible(model.name, dataset.name, dataset.options)
        except ValueError:  # the dataset's options have their own error
            return dataset
        if reason is None:
            return dataset
        # The catalog's reason already names the datasets and models that would work.
        raise spec_error("incompatible", reason, compatible_datasets(model.name))

    @field_validator("accumulation_steps")
    @classmethod
    def _window_fits(cls, steps: int | dict[str, int] | None, info: ValidationInfo) -> Any:
        micro, world = info.data.get("micro_batch_size"), _world(info.data)
        if steps is None or not isinstance(micro, int) or world is None:
            return steps  # nothing to multiply, or an earlier field has its own error
        largest = max(steps.values()) if isinstance(steps, dict) else steps
        if (samples := micro * largest * world) > MAX_STORED_INT:
            raise spec_error(
                "accumulation_steps",
                f"micro_batch_size {micro} x accumulation_steps {largest} x ranks {world} "
                f"(nodes x gpus) = {samples} samples per optimizer step; at most "
                f"{MAX_STORED_INT} are supported",
            )
        return steps

    @field_validator("effective_batch_size")
    @classmethod
    def _batch_geometry(cls, effective: int | None, info: ValidationInfo) -> int | None:
        data = info.data
        if not {"gpus", "nodes", "micro_batch_size", "accumulation_steps"} <= data.keys():
            return effective  # an earlier field failed and has its own error
        micro, steps, world = (
            data["micro_batch_size"],
            data["accumulation_steps"],
            max(data["gpus"], 1) * data["nodes"],
        )
        if micro == AUTO and effective is None:
            raise spec_error(
                "auto_needs_effective_batch",
                'micro_batch_size "auto" needs effective_batch_size (samples per optimizer step) '
                "instead of accumulation_steps: the micro-batch is chosen to divide it",
            )
        if steps is not None and effective is not None:
            raise spec_error(
                "exactly_one",
                "give accumulation_steps or effective_batch_size, not both "
                "(effective_batch_size = micro_batch_size x accumulation_steps x gpus)",
            )
        if steps is None and effective is None:
            raise spec_error(
                "missing_one_of",
                "give accumulation_steps (micro-batches per optimizer step) "
                "or effective_batch_size (samples per optimizer step)",
                ("accumulation_steps", "effective_batch_size"),
            )
        if effective is None:
            return None
        ranks = f"gpus {world}" if data["nodes"] == 1 else f"{world} ranks (nodes x gpus)"
        if effective % world:
            raise spec_error(
                "not_divisible",
                f"effective_batch_size {effective} is not divisible by {ranks}; "
                f"use a multiple of {world}",
            )
        per_gpu = effective // world
        if micro == AUTO:
            return effective
        if per_gpu % micro:
            divisors = [d for d in _divisors(per_gpu) if d <= MAX_MICRO_BATCH_SIZE]
            times_gpus = f" x {ranks}" if world > 1 else ""
            raise spec_error(
                "not_divisible",
                f"effective_batch_size {effective} is not divisible by micro_batch_size {micro}"
                f"{times_gpus}; micro_batch_size values that divide it: {', '.join(map(str, divisors))}",
                divisors,
            )
        if per_gpu // micro > MAX_ACCUMULATION_STEPS:
            raise spec_error(
                "accumulation_steps",
                f"effective_batch_size {effective} needs {per_gpu // micro} accumulation steps at "
                f"micro_batch_size {micro}; at most {MAX_ACCUMULATION_STEPS} are allowed: "
                "raise micro_batch_size",
            )
        return effective

    @field_validator("min_nodes")
    @classmethod
    def _fewer_nodes_keep_the_batch(cls, min_nodes: int | None, info: ValidationInfo) -> int | None:
        """Default: `nodes`. On k of them (min_nodes <= k < nodes), each rank's share of the
        effective batch must still be whole micro-batches: N grows, the batch stays."""
        data = info.data
        nodes = data.get("nodes")
        if nodes is None:
            return min_nodes  # nodes failed validation and has its own error
        if min_nodes is None:
            return int(nodes)
        if min_nodes > nodes:
            raise spec_error(
                "min_nodes",
                f"min_nodes {min_nodes} is more than nodes {nodes}; give at most {nodes} (the "
                "fewest nodes the job may continue on), or leave it out for nodes",
                list(range(1, nodes + 1)),
            )
        if not {"gpus", "micro_batch_size", "accumulation_steps", "effective_batch_size"} <= data.keys():
            return min_nodes  # an earlier field failed and has its own error
        micro, gpus = data["micro_batch_size"], data["gpus"]
        if not isinstance(micro, int):
            return min_nodes  # "auto": the worker chooses m for the world it gets
        batches = _effective_batches(data, micro, world_of(gpus, nodes))
        fit = [k for k in range(1, nodes + 1) if all(b % (micro * world_of(gpus, k)) == 0 for b in batches)]
        short = [k for k in range(min_nodes, nodes) if k not in fit]
        if short:
            raise spec_error(
                "min_nodes",
                f"on {short[0]} node{'s' if short[0] != 1 else ''} (min_nodes {min_nodes} <= it < "
                f"nodes {nodes}) the effective batch of {batches[0]} samples is not whole "
                f"micro-batches of {micro} on {world_of(gpus, short[0])} ranks; choose min_nodes among the "
                "node counts where it divides (and every count between it and nodes does)",
                [k for k in fit if all(j in fit for j in range(k, nodes))],
            )
        return min_nodes

    @field_validator("max_steps")
    @classmethod
    def _epochs_or_max_steps(cls, max_steps: int | None, info: ValidationInfo) -> int | None:
        if "epochs" not in info.data:
            return max_steps  # epochs failed validation and has its own error
        epochs = info.data["epochs"]
        if epochs is not None and max_steps is not None:
            raise spec_error("exactly_one", "give epochs or max_steps, not both")
        if epochs is None and max_steps is None:
            raise spec_error(
                "missing_one_of",
                "give epochs (passes over the training set) or max_steps (optimizer steps)",
                ("epochs", "max_steps"),
            )
        return max_steps

    @field_validator("fsdp")
    @classmethod
    def _fsdp_applies(cls, options: FsdpOptions | None, info: ValidationInfo) -> FsdpOptions | None:
        return check_fsdp(options, info.data)

    @field_validator("peft")
    @classmethod
    def _peft_applies(cls, options: PeftOptions | None, info: ValidationInfo) -> PeftOptions | None:
        return check_peft(options, info.data)

    @field_validator("register_model")
    @classmethod
    def _register_needs_mlflow(cls, name: str | None, info: ValidationInfo) -> str | None:
        trackers = info.data.get("trackers")
        if name is not None and trackers is not None and "mlflow" not in trackers:
            raise spec_error(
                "register_model",
                f"register_model {name!r} registers the final checkpoint in MLflow: add "
                '"mlflow" to trackers, or leave register_model out',
            )
        return name

    @model_validator(mode="after")
    def _default_name(self) -> Self:
        if self.name is None:
            self.name = f"{self.model.name}-{self.dataset.name}"
        return self

    def local_paths(self) -> list[tuple[tuple[str, ...], str]]:
        """(field path, path) of every local file or directory the job reads beside its
        data_root: the API and the worker check each against the allowed data roots."""
        paths = [(("dataset", "data_root"), self.dataset.data_root),
                 (("model", "name"), model_path(self.model.name)),
                 (("model", "weights"), self.model.options.get("weights")),
                 (("init_from", "uri"), self.init_from.uri if self.init_from else None)]
        return [(where, path) for where, path in paths if isinstance(path, str)]

    def normalised(self) -> dict[str, Any]:
        """JSON-ready spec with every default filled; `parse_spec` of it gives this spec back."""
        # tags and notes are the job's metadata (its row keeps them, editable): not the spec's.
        data = self.model_dump(
            mode="json", exclude={"model", "dataset", "optimizer", "scheduler", "init_from", "tags", "notes"}
        )
        if self.init_from is not None:
            data["init_from"] = self.init_from.normalised()
        data["model"] = self.model.normalised()
        data["dataset"] = self.dataset.normalised()
        data["optimizer"] = self.optimizer.normalised()
        data["scheduler"] = self.scheduler.normalised()
        # Left out when unused, so specs submitted before trackers existed hash the same.
        data["peft"] = self.peft.normalised() if self.peft is not None else None
        for unused in [key for key in ("trackers", "register_model", "fsdp", "activation_checkpointing", "peft")
                       if not data[key]]:
            del data[unused]
        if self.nodes == 1:  # single-node specs hash as they did before nodes existed
            del data["nodes"], data["min_nodes"]
        if data["strategy"] == "ddp":  # the default, left out so older specs hash the same
            del data["strategy"]
        return data


def stored(spec: Mapping[str, Any] | None, name: str) -> Any:
    """Field ``name`` of a stored (normalised) spec, or ``JobSpec``'s default when the spec left
    it out: ``normalised`` drops the defaults of fields added later (nodes, min_nodes, strategy,
    trackers, fsdp, ...) so that older specs hash the same, and a reader of the stored spec asks
    here rather than restating them. ``min_nodes`` defaults to the spec's ``nodes``."""
    value = (spec or {}).get(name)
    if value is not None:
        return value
    if name == "min_nodes":
        return stored(spec, "nodes")
    return JobSpec.model_fields[name].get_default(call_default_factory=True)


def parse_spec(raw: Mapping[str, Any] | str | bytes) -> JobSpec:
    """Validate a spec (a dict, or JSON text); raises `pydantic.ValidationError`."""
    if isinstance(raw, str | bytes):
        return JobSpec.model_validate_json(raw)
    return JobSpec.model_validate(raw)
