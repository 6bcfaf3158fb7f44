"""accum settings: one class, read from ``ACCUM_*`` environment variables.

Nothing is read at import time. Call ``get_settings()`` at start-up (API, worker, CLI) and pass
the object down; tests build ``Settings(home=tmp_path, ...)`` directly.

Example::

    ACCUM_HOME=/srv/accum ACCUM_DATABASE_URL=postgresql+psycopg://u@db/accum accum db upgrade

Every local path (SQLite database, embedded broker, artefacts, the local token) lives under
``ACCUM_HOME`` unless overridden.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.data_root_entries import DataRootEntry

DATABASE_SCHEMES = ("sqlite", "postgresql+psycopg")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# The experiment trackers a worker can log a job to (services.worker.trackers).
TRACKERS = ("mlflow", "tensorboard", "wandb")
BROKER_SCHEMES = ("sqlite", "redis", "rediss", "sqla+sqlite", "sqla+postgresql", "amqp", "memory")


class Settings(BaseSettings):
    """Runtime configuration; each field is the env var ``ACCUM_<FIELD>`` upper-cased."""

    model_config = SettingsConfigDict(env_prefix="ACCUM_", extra="ignore", validate_default=True)

    home: Path = Field(default=Path("./.accum"), description="All local state lives here.")
    database_url: str = Field(
        default="", description="SQLAlchemy URL; default sqlite:///<home>/accum.sqlite."
    )
    broker_url: str = Field(
        default="",
        description=(
            "Celery broker; default the embedded SQLite transport "
            "(services.dispatch.sqlite_transport) at sqlite:///<home>/broker.sqlite."
        ),
    )
    # Where checkpoints live: a path or file:// URL (a local disk, an NFS share), or
    # s3://bucket/prefix on any S3-compatible service (credentials, endpoint and region from the
    # standard AWS_* environment, never from here). Default <home>/artifacts.
    artifacts_url: str = Field(default="", description="file:///path, a path, or s3://bucket/prefix.")
    # The older name: a local path, used when ACCUM_ARTIFACTS_URL is unset.
    artifacts_dir: Path | None = Field(default=None, description="Default <home>/artifacts.")
    # A node's bounded cache of checkpoints fetched from the store (LRU), and of the
    # checkpoints its trainers write before they are uploaded. Default <home>/cache.
    cache_dir: Path | None = Field(default=None, description="Default <home>/cache.")
    cache_max_bytes: int = Field(default=20 * 1024**3, gt=0)
    # A sharded (FSDP) checkpoint whose shards total at most this many bytes is also stored as
    # one consolidated file (rank 0 of the attempt holds the full state in host memory to write
    # it): what GET .../checkpoints/{step} serves. Larger ones are shards only. 0: never.
    consolidate_max_bytes: int = Field(default=4 * 1024**3, ge=0)
    # Downloads from an S3 store: 307 to a presigned URL instead of streaming through the API.
    download_redirect: bool = False
    # Checkpoints of jobs finished longer ago than this are deleted (the final and the best by
    # val_loss stay); 0 keeps them forever.
    retention_days: float = Field(default=0, ge=0)
    # An owner's checkpoints may take this many bytes in the store; a job whose next checkpoint
    # would pass it fails (nothing written) with how to make room. 0: no quota.
    max_artifact_bytes_per_owner: int = Field(default=0, ge=0)
    # /readyz writes, reads and deletes a small object at most this often (in the background:
    # an answer never waits for the store more than 0.5 s).
    store_probe_ttl_s: float = Field(default=5.0, ge=0)
    presign_expires_s: int = Field(default=300, gt=0, le=7 * 24 * 3600)
    lease_timeout_s: float = Field(default=60.0, gt=0)
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    # How often a training job's host CPU/memory, process RSS and GPU figures are sampled; each
    # sample is recorded with the next optimizer step (services.worker.system_metrics).
    system_metrics_every_s: float = Field(default=1.0, ge=0.05, le=3600)
    reaper_interval_s: float = Field(default=10.0, gt=0)
    # A queued job whose broker message was sent longer ago than this gets another one from
    # the reaper (the first may be lost: broker down at submit time, a worker killed between
    # taking the message and claiming the job). Long enough that a job merely waiting for a
    # busy worker gets at most one duplicate (harmless: the claim drops it) per period.
    requeue_after_s: float = Field(default=300.0, gt=0)
    # The same rescue in seconds where waiting cannot explain it (issue 42: Redis restarted
    # without persistence, a managed failover): a queued job whose last message is this old,
    # while a worker of its queue sits idle and the broker holds no message for it (waiting on
    # the queue or taken by a worker), is sent again (services.housekeeping.reaper).
    idle_requeue_after_s: float = Field(default=5.0, gt=0)
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    # Where a job's `dataset.data_root` may point: one list that the API (at submit) and every
    # worker (before reading) check, so give them the same. Empty: <home>/data, which is the
    # same directory only where API and workers share a home (one host, `accum up`).
    # Env: a JSON list, ACCUM_DATA_ROOTS='["/datasets", "/mnt/shared/data", "s3://datasets/public"]'.
    # An entry may name its readers: "alice:/data/alice", "alice,bob:/data/team", or hold
    # {owner} ("/data/users/{owner}"); a plain one is everyone's (services/data_roots.py).
    # An s3:// entry allows that bucket and prefix: without one, no s3 data_root is allowed (a
    # worker would otherwise sync whatever bucket its credentials read, checkpoints included).
    data_roots: list[Path | str] = Field(
        default_factory=list,
        description="Directories or s3://bucket/prefix a job's dataset.data_root may be in "
                    "(default: <home>/data).",
    )
    # GET /metrics wants "Authorization: Bearer <this>" when set (a scraper's own secret, no
    # owner's token); empty: /metrics is open, as before (keep it off the public network then).
    metrics_token: SecretStr | None = None
    # Per-owner cap on jobs that are queued or running; a submit past it is 429.
    max_active_jobs_per_owner: int = Field(default=1000, gt=0)
    # Failed token checks allowed per client address in a sliding window before 429.
    auth_failures_per_window: int = Field(default=20, gt=0)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # Reverse proxies whose X-Forwarded-For is believed (comma-separated IPs or networks; "*"
    # trusts any peer). Empty: the socket's peer is the client, whatever headers it sends.
    forwarded_allow_ips: str = ""
    # Concurrent live event streams per owner (in each API process); one more is 429.
    max_streams_per_owner: int = Field(default=20, gt=0)
    # An open stream looks its token up again this often and closes once it is revoked.
    stream_token_recheck_s: float = Field(default=10.0, gt=0, le=10.0)
    sqlite_busy_timeout_s: float = Field(default=30.0, gt=0)
    # The fleet (services/fleet.py): a queue no registered worker has served for this long is
    # refused at submit (422 naming the queues that exist), unless empty queues are allowed
    # (an autoscaled fleet that starts workers for queued jobs). No worker registered at all
    # (a fresh deployment, tests of the API alone) means no check.
    queue_grace_s: float = Field(default=86400.0, gt=0)
    allow_empty_queues: bool = False
    # Jobs one owner may have running at once on one queue (0 = no cap): a claim past it
    # leaves the job queued for the owner's next free place (services/jobdb/queue_order.py).
    max_running_jobs_per_owner: int = Field(default=0, ge=0)
    # The worker's own Prometheus endpoint (services.worker.metrics_server): upload seconds and
    # bytes, fetch seconds, store errors. 0 = off.
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    worker_metrics_host: str = "127.0.0.1"
    # A worker without GPUs offers this many CPU ranks (gloo) to `gpus: k` jobs, k <= it, and
    # registers them (`accum worker --cpu-ranks K`). 0: `gpus: 0` or `1` jobs only, one process;
    # such a worker never trains a `gpus: 2` job on CPU (services/fleet.py).
    cpu_ranks: int = Field(default=0, ge=0, le=64)
    # A worker refuses to start as root unless this is set (issue 42): a job's code, data paths
    # and errors would run and read with root's rights. The Docker image runs as its own user.
    allow_root: bool = False
    # Multi-node jobs (`nodes: n`, services.jobdb.gangs, services.worker.gang). The address this
    # worker's node is reached at by the other nodes of a gang it leads (its rendezvous store
    # listens there), the ports it may open for that, and how long a gang may take to gather
    # its n workers before it releases them (the job waits again, with the reason in an event).
    advertise_address: str = "127.0.0.1"
    rendezvous_ports: str = "29500-29599"
    gang_form_timeout_s: float = Field(default=120.0, gt=0)
    # How long a rank waits in one collective (torch.distributed's process-group timeout) before
    # its attempt ends: a dead or hung peer is noticed within it, not NCCL's default 10 minutes.
    collective_timeout_s: float = Field(default=60.0, gt=0)
    # Submit-time maxima (services.spec.limits): a spec above them is a 422 at its field.
    max_restarts: int = Field(default=10, ge=0, le=100, description="Most max_restarts a job may ask.")
    max_gpus: int = Field(default=8, ge=0, le=64, description="Most gpus a job may ask.")
    # The largest device a job may run on, until the worker registry reports real ones: a
    # spec whose memory floor (services.catalog.sizes) is above it cannot fit anywhere.
    max_device_memory_bytes: int = Field(default=80 * 2**30, gt=0)
    # A job's run time (over its attempts since submit or the last resume): the default of
    # its `timeout` and the most it may ask.
    max_job_seconds: int = Field(default=7 * 86400, gt=0, le=30 * 86400)
    # The fewest optimizer steps between a job's checkpoints: what the artifact store can take
    # (each checkpoint is an upload; at most one in flight per job, so a store slower than the
    # interval slows training). 1 keeps every spec valid (demo, tests); raise it on a shared store.
    min_checkpoint_every: int = Field(default=1, ge=1, le=2_147_483_647,
                                      description="Fewest checkpoint_every a job may ask.")
    # Lost attempts in a row without a new checkpoint after which a job fails as `poison`
    # instead of taking down another worker (0: never).
    poison_after_lost_attempts: int = Field(default=2, ge=0)
    # cgroup v2 memory events of the worker's cgroup: its `oom_kill` counter, read before and
    # after a prefork child dies, tells a kernel OOM kill from another SIGKILL.
    oom_events_file: Path = Path("/sys/fs/cgroup/memory.events")

    # Experiment trackers this deployment offers: a job names the ones it wants in its spec's
    # `trackers` (422 for another). Env: a JSON list, ACCUM_TRACKERS='["mlflow","tensorboard"]'.
    # Credentials come from the workers' environment as each tracker's client expects them
    # (MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN, WANDB_API_KEY, AWS_* for s3:// event files).
    trackers: list[str] = Field(default_factory=list, description="Trackers jobs may ask for.")
    # The MLflow tracking server the workers log to, and the experiment jobs' runs go in.
    mlflow_tracking_uri: str = ""
    mlflow_experiment: str = "accum"
    # TensorBoard event files go to <artifacts>/tensorboard/<job id>/ (an s3:// store too), so
    # `tensorboard --logdir <artifacts>/tensorboard` shows every job. A TensorBoard server's
    # address, when there is one, makes the job's link.
    tensorboard_url: str = ""
    # Weights & Biases: `online`, or `offline` for air-gapped nodes (run directories under
    # wandb_dir that `wandb sync` uploads later).
    wandb_mode: str = Field(default="online", pattern="^(online|offline)$")
    wandb_project: str = "accum"
    wandb_entity: str = ""
    wandb_dir: Path | None = Field(default=None, description="Default <home>/wandb.")
    wandb_base_url: str = "https://wandb.ai"
    # How often a tracker receives a job's points: one batch per period keeps logging far
    # below 1 % of step time (bench/trainer/tracker_overhead.py).
    tracker_flush_every_s: float = Field(default=2.0, gt=0)
    # How long an attempt's end waits for a tracker that is down before the job finishes
    # anyway; its points are delivered by the worker once the tracker is back.
    tracker_end_wait_s: float = Field(default=30.0, ge=0)
    # At most this many steps wait in a tracker's buffer (a long outage, a tracker slower than
    # training); older ones are let go and read back from accum's metrics store when it is back.
    tracker_buffer_max_steps: int = Field(default=100_000, ge=10, le=10_000_000)
    # How far below training the tracker host process runs (its `nice` increment; W&B's own
    # service process inherits it): on a node whose cores training keeps busy, delivery takes
    # the idle time instead of time slices from the ranks. 0 runs it at training's priority.
    tracker_host_nice: int = Field(default=10, ge=0, le=19)
    # A job's own output (`accum logs`), captured per attempt by the worker: the first this
    # many lines are stored, each cut at this many bytes (the worker's stdout shows them all).
    log_max_lines_per_attempt: int = Field(default=10_000, ge=1, le=1_000_000)
    log_max_line_bytes: int = Field(default=4096, ge=80, le=1_000_000)

    @field_validator("home", mode="after")
    @classmethod
    def _absolute_home(cls, home: Path) -> Path:
        # Resolved once, so a later chdir (Celery daemonising, tests) cannot move the state.
        return home.expanduser().resolve()

    @field_validator("trackers", mode="after")
    @classmethod
    def _known_trackers(cls, trackers: list[str]) -> list[str]:
        unknown = [name for name in trackers if name not in TRACKERS]
        if unknown:
            raise ValueError(
                f"ACCUM_TRACKERS names {', '.join(map(repr, unknown))}; the trackers accum can "
                f"log to are {', '.join(TRACKERS)} (a JSON list, e.g. '[\"mlflow\"]')"
            )
        return list(dict.fromkeys(trackers))

    @field_validator("forwarded_allow_ips", mode="after")
    @classmethod
    def _proxy_addresses(cls, spec: str) -> str:
        trusted_proxies(spec)  # a typo fails at start-up, not on the first request
        return spec

    @field_validator("advertise_address", mode="after")
    @classmethod
    def _reachable_address(cls, address: str) -> str:
        advertised_address(address)
        return address

    @field_validator("rendezvous_ports", mode="after")
    @classmethod
    def _port_range(cls, spec: str) -> str:
        port_range(spec)
        return spec

    @field_validator("database_url", mode="after")
    @classmethod
    def _known_database(cls, url: str) -> str:
        if not url:
            return url
        # psycopg2 is not installed: the bare scheme would fail later with an import error.
        for bare in ("postgres://", "postgresql://"):
            if url.startswith(bare):
                url = "postgresql+psycopg://" + url[len(bare) :]
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme not in DATABASE_SCHEMES:
            raise ValueError(
                f"ACCUM_DATABASE_URL {url!r} is not supported; use sqlite:///<path> or "
                "postgresql+psycopg://user@host:5432/dbname"
            )
        return url

    @field_validator("broker_url", mode="after")
    @classmethod
    def _known_broker(cls, url: str) -> str:
        if url and url.split("://", 1)[0] not in BROKER_SCHEMES:
            raise ValueError(
                f"ACCUM_BROKER_URL {url!r} is not supported; use redis://host:6379/0 or leave it "
                f"unset for the embedded SQLite broker (schemes: {', '.join(BROKER_SCHEMES)})"
            )
        return url

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_root_entries(cls, roots: Any) -> Any:
        # A plain path stays a Path (the format before owners); an entry with owners, {owner}
        # or s3:// stays the text it is (a Path would fold "s3://b/p" into "s3:/b/p").
        if not isinstance(roots, list):
            return roots
        entries: list[Path | str] = []
        for root in roots:
            if isinstance(root, str):
                entry = DataRootEntry.parse(root)  # ValueError: how to write the entry
                entries.append(Path(root) if entry.is_plain and not entry.is_s3 else root)
            else:
                entries.append(root)
        return entries

    @model_validator(mode="after")
    def _defaults_under_home_and_sane_timing(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.home / 'accum.sqlite'}"
        if not self.broker_url:
            self.broker_url = f"sqlite:///{self.home / 'broker.sqlite'}"
        self._artifacts_location()
        self.cache_dir = (self.cache_dir or self.home / "cache").expanduser().resolve()
        self.wandb_dir = (self.wandb_dir or self.home / "wandb").expanduser().resolve()
        if "mlflow" in self.trackers and not self.mlflow_tracking_uri:
            raise ValueError(
                "ACCUM_TRACKERS offers mlflow but ACCUM_MLFLOW_TRACKING_URI is empty; set it to "
                "the tracking server, e.g. http://mlflow:5000"
            )
        if self.heartbeat_interval_s * 2 > self.lease_timeout_s:
            raise ValueError(
                f"ACCUM_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}) must be at most half of "
                f"ACCUM_LEASE_TIMEOUT_S ({self.lease_timeout_s}), so one late heartbeat does not "
                "lose the lease; raise the timeout or lower the interval"
            )
        return self

    def _artifacts_location(self) -> None:
        url = self.artifacts_url or str(self.artifacts_dir or self.home / "artifacts")
        scheme = urlsplit(url).scheme
        if scheme == "s3":
            if not urlsplit(url).netloc:
                raise ValueError(f"ACCUM_ARTIFACTS_URL {url!r} names no bucket; use s3://bucket/prefix")
            self.artifacts_url = url.rstrip("/")
            # Nothing is written here with an S3 store: kept for the local defaults' sake.
            self.artifacts_dir = (self.artifacts_dir or self.home / "artifacts").expanduser().resolve()
            return
        if scheme not in ("", "file"):
            raise ValueError(
                f"ACCUM_ARTIFACTS_URL {url!r} is not supported; use a path, file:///path or "
                "s3://bucket/prefix"
            )
        local = Path(unquote(urlsplit(url).path)) if scheme == "file" else Path(url)
        self.artifacts_dir = local.expanduser().resolve()
        self.artifacts_url = self.artifacts_dir.as_uri()

    @property
    def cache_path(self) -> Path:
        """``cache_dir`` typed as a ``Path`` (always set after validation)."""
        assert self.cache_dir is not None
        return self.cache_dir

    @property
    def wandb_path(self) -> Path:
        """``wandb_dir`` typed as a ``Path`` (always set after validation)."""
        assert self.wandb_dir is not None
        return self.wandb_dir

    @property
    def artifacts_on_s3(self) -> bool:
        return self.artifacts_url.startswith("s3://")

    @property
    def artifacts_path(self) -> Path:
        """``artifacts_dir`` typed as a ``Path`` (always set after validation)."""
        assert self.artifacts_dir is not None
        return self.artifacts_dir


def advertised_address(address: str) -> str:
    """``ACCUM_ADVERTISE_ADDRESS``: an IP address or a host name other nodes can connect to;
    raises ValueError with the fix otherwise (a wildcard address names no node)."""
    value = address.strip()
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        labels = value.rstrip(".").split(".")
        if value and all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels):
            return value
        raise ValueError(
            f"ACCUM_ADVERTISE_ADDRESS {address!r} is neither an IP address nor a host name; set "
            "it to the address the other nodes reach this one at (default 127.0.0.1: one machine)"
        ) from None
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(
            f"ACCUM_ADVERTISE_ADDRESS {address!r} names no single node (a wildcard or multicast "
            "address); set it to this node's own address, the one the other nodes connect to"
        )
    return value


def port_range(spec: str) -> range:
    """``ACCUM_RENDEZVOUS_PORTS`` ("29500-29599", or one port "29500") as a range; raises
    ValueError naming the fix when it is not an ascending range within 1024-65535."""
    match = re.fullmatch(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", spec)
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
    if not (1024 <= low <= high <= 65535):
        raise ValueError(
            f"ACCUM_RENDEZVOUS_PORTS {spec!r} must be a port range such as 29500-29599 (or one "
            "port), from 1024 to 65535, low to high: the ports a gang's node 0 may open for its "
            "rendezvous, open between the nodes"
        )
    return range(low, high + 1)


def trusted_hosts(spec: str) -> list[str]:
    """``trusted_proxies`` as uvicorn's ``ProxyHeadersMiddleware`` takes them, networks in
    canonical form: it would take "198.18.2.3/16" (host bits set), like a typo, as a name that
    never matches, and trust nothing for it without a word."""
    return [str(network) for network in trusted_proxies(spec)]


def trusted_proxies(spec: str) -> tuple[Network, ...]:
    """`"192.0.2.5, 198.18.0.0/16"` -> networks; `"*"` trusts every peer. ValueError on a typo."""
    networks = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == "*":
            networks += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"ACCUM_FORWARDED_ALLOW_IPS: {part!r} is not an IP address or network; give "
                "the reverse proxies' addresses, comma-separated, e.g. 192.0.2.5,198.18.0.0/16"
            ) from None
    return tuple(networks)


def get_settings() -> Settings:
    """Build settings from the environment now (never cached: tests change the env)."""
    return Settings()
