"""Whether a rank failed because its process group lost a peer (a node died or hung), not
because training raised: ``lost_peer(exc)`` in the rank, on the exception it died of, and
``killed(exitcode)`` in the worker that watches its ranks. A lost peer resumes the job from its
last checkpoint (``NodeLost``); an error in training fails it.

    try:
        run_attempt(...)
    except BaseException as exc:
        peer_lost[local_rank] = lost_peer(exc)      # read by services.worker.distributed
        raise

By type first: c10d's error classes (``DistBackendError``: NCCL's communicator errors and its
timeouts; ``DistNetworkError``: the rendezvous store's host gone; ``DistStoreError``: a store
operation timed out) and ``TimeoutError``, anywhere in the exception's chain. gloo cannot tell
by type: on torch 2.14 a peer's closed connection and the collective timeout
(``ACCUM_COLLECTIVE_TIMEOUT_S``) are both a plain ``RuntimeError``, so as a last resort its
message is read, and only for where gloo raised it: its TCP transport (``gloo/transport/``),
the layer that talks to peers (``tests/worker/test_peer_loss.py`` kills and stops real gloo
peers to produce them).
"""

from __future__ import annotations

import re

import torch.distributed as dist

# c10d's own classes for a failed backend, network or store, and a timeout.
PEER_ERRORS: tuple[type[BaseException], ...] = (
    dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError, TimeoutError,
)
# gloo's RuntimeError names the source location that raised it (first, or after DDP's words), e.g.
# "[.../gloo/transport/tcp/pair.cc:545] Read error ...: Connection reset by peer" or
# "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv ...".
GLOO_TRANSPORT = re.compile(r"\[[^\]\s]*gloo/transport/[^\]\s]*\]")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from or while handling) is the process
    group failing: a c10d error class, a timeout, or gloo's transport failing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, PEER_ERRORS):
            return True
        if type(current) is RuntimeError and GLOO_TRANSPORT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def killed(exitcode: int | None) -> bool:
    """Whether a rank's process was killed by a signal rather than exiting on an error it
    raised: SIGKILL (the kernel's OOM killer, its node going down), SIGABRT (NCCL's watchdog
    ending a rank whose collective timed out). The rank's share of the world is gone."""
    return exitcode is not None and exitcode < 0
