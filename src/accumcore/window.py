"""One window: the forward/backward passes between two optimizer steps.

The window's micro-batches have already been read (rule 2 of docs/accumulation.md), or at least
their targets (``window_source``: the inputs are then loaded one micro-batch at a time), so
their item counts n_i and the window total W are known before the first backward. Micro-batch i is
backpropagated with weight n_i / W, which makes the summed gradient exactly the gradient of
the window's mean loss, whatever the sizes and padding of the micro-batches (rule 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accumcore import distributed, items, sharding
from accumcore.device_feed import DeviceFeed
from accumcore.oom import MicroBatchTooSmall, is_oom, release_memory
from accumcore.precision import Precision
from accumcore.rng import KeyedRng, capture_rng_state, micro_batch_seed, restore_rng_state
from accumcore.window_source import PendingBatch, split_indices


@dataclass
class WindowResult:
    loss_sum: float | torch.Tensor | None  # sum over local items of the per-item loss
    items: float | torch.Tensor  # W over all ranks
    samples: float | torch.Tensor  # samples over all ranks
    micro_batches: int
    manual_sync: bool = False  # DDP: some rank had no micro-batch; average the grads at the step
    oom: bool = False  # DDP: this rank ran out of memory and dropped the window
    oom_fatal: bool = False  # ... with micro-batches of one sample: it cannot back off
    last_window: bool = False  # DDP: every rank's loader says this is the epoch's last window
    error: BaseException | None = None  # DDP: this rank's micro-batch raised; every rank learns it at the step


@dataclass
class MicroBatch:
    inputs: Any  # None while ``pending`` is set: loaded just before the forward
    targets: Any
    items: int | float | torch.Tensor
    samples: int
    pending: PendingBatch | None = None
    rng_key: int | None = None  # its forward's and backward's RNG seed (``rng.KeyedRng``); None: unkeyed

    def load(self) -> tuple[Any, Any]:
        """(inputs, targets) of this micro-batch, loading them now if they are pending."""
        if self.pending is None:
            return self.inputs, self.targets
        inputs, targets = items.unpack(self.pending.source.load(self.pending.indices))
        if self.pending.source.verify:
            loaded = items.normalise_count(self.pending.source.count(inputs, targets))
            if not _same_count(loaded, self.items):
                raise RuntimeError(
                    f"the window was weighted with {self.items} items for this micro-batch, but its "
                    f"loaded targets hold {loaded}: the loader's targets_for / the dataset's "
                    "targets attribute must return the targets the loader yields"
                )
        return inputs, targets


def _same_count(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return True  # device counts: checking would be a sync per micro-batch
    return bool(a == b)


def make_micro_batches(
    window: list[Any], split: int, counter: Callable[[Any, Any], int | torch.Tensor],
    keys: Sequence[int] | None = None,
) -> list[MicroBatch]:
    """Unpack loaded batches, split each into ``split`` chunks (OOM back-off), count items.
    ``keys``: each loaded batch's RNG key (``rng.micro_batch_seed``); a split batch's pieces
    get keys of their own."""
    result = []
    for number, batch in enumerate(window):
        key = keys[number] if keys is not None and number < len(keys) else None
        if isinstance(batch, PendingBatch):
            result += _pending_micro_batches(batch, split, counter, key)
            continue
        inputs, targets = items.unpack(batch)
        if split == 1:
            pieces = [(inputs, targets)]
        else:
            pieces = list(zip(items.split(inputs, split), items.split(targets, split), strict=True))
        for part, (chunk_inputs, chunk_targets) in enumerate(pieces):
            if items.first_dim(chunk_inputs) == 0:
                continue  # a batch smaller than the split leaves empty chunks
            count = items.normalise_count(counter(chunk_inputs, chunk_targets))
            result.append(MicroBatch(chunk_inputs, chunk_targets, count, items.first_dim(chunk_inputs),
                                     rng_key=_part_key(key, split, part)))
    return result


def _part_key(key: int | None, split: int, part: int) -> int | None:
    """The key of piece ``part`` of a batch split in ``split`` (the batch's own when unsplit)."""
    if key is None or split == 1:
        return key
    return micro_batch_seed(key, 0, part=part + 1)


def _pending_micro_batches(
    batch: PendingBatch, split: int, counter: Callable[[Any, Any], int | torch.Tensor], key: int | None = None,
) -> list[MicroBatch]:
    """Micro-batches counted from targets alone; each loads its own indices when it runs."""
    if split == 1:  # the common case: the loaded batch is the micro-batch, no new objects
        if not batch.indices:
            return []
        source = batch.source
        if source.count_for is not None and counter is source.count:
            count: int | float | torch.Tensor = source.count_for(batch.indices)  # no targets read
        else:
            count = items.normalise_count(counter(None, batch.targets))
        return [MicroBatch(None, None, count, len(batch.indices), batch, key)]
    result = []
    pieces = zip(split_indices(batch.indices, split), items.split(batch.targets, split), strict=True)
    for part, (indices, targets) in enumerate(pieces):
        if not indices:
            continue
        count = items.normalise_count(counter(None, targets))
        pending = PendingBatch(indices, targets, batch.source)
        result.append(MicroBatch(None, None, count, len(indices), pending, _part_key(key, split, part)))
    return result


# What ``WindowRunner.run`` returns instead of a result: a callback asked to stop (on any
# rank, under DDP), or, under DDP, no rank has a micro-batch left in this epoch.
STOPPED = "stopped"
EXHAUSTED = "exhausted"
# Under DDP/FSDP: some rank failed before the window (its ``failed`` flag in the window's
# all-reduce); every rank then raises that rank's error (``distributed.raise_agreed``).
FAILED = "failed"


@dataclass
class _Agreement:
    """The ranks' agreement on a window (``WindowRunner._agree``)."""

    total_items: float | torch.Tensor
    total_samples: float | torch.Tensor
    weight_factor: int  # DDP/FSDP average gradients over ranks: the loss is scaled back up
    manual_sync: bool  # some rank has no micro-batch: its gradients are averaged at the step
    last_window: bool  # every rank's loader says this window ends the epoch
    passes: int  # forward/backward passes every rank runs (FSDP: the busiest rank's count)


class WindowRunner:
    """Runs a window's forward and backward passes; stepping is the trainer's job.

    Under DDP every rank runs the same windows: the window's one small all-reduce carries the
    item and sample counts and two flags, "I have micro-batches" and "stop", so all ranks stop
    together, end the epoch together, and know before the first backward whether a rank has
    nothing in this window (uneven shards at an epoch's end). Such a window runs on the bare
    module, and its gradients are averaged by ``distributed.all_reduce_grads`` at the step, so
    the empty rank joins every collective with zeros. An out-of-memory error on one rank is
    caught here: that rank drops its window, joins the gradient all-reduce with an empty batch,
    and the stepper's all-reduce tells every rank to back off.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        precision: Precision,
        device: torch.device,
        should_stop: Callable[[], bool] | None,
        fsdp_sync: str = sharding.DEFAULT_SYNC,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.precision = precision
        self.device = device
        self.should_stop = should_stop
        self.ddp = distributed.ddp_wrapped(model)
        # FSDP (rule 13): every rank runs as many passes as the rank with the most
        # micro-batches; "window" defers the reduce-scatter to the window's last pass.
        self.sharded = sharding.is_sharded(model)
        self.defer_sync = self.sharded and sharding.check_sync_mode(fsdp_sync) == "window"
        self.collective = self.ddp or self.sharded  # the window's counts are all-reduced
        self.empty_inputs: Any = None  # FSDP: one row of an earlier micro-batch, for extra passes
        # DDP: one row (copied) of the first micro-batch whose forward ran: the empty pass of a
        # rank whose micro-batch raised (its own row may raise the same way).
        self.good_empty: Any = None
        # DDP/FSDP with BatchNorm: records each micro-batch's statistics (``batchnorm_sync``).
        self.batchnorm: Any = None
        self.feed = DeviceFeed(device)
        self.keyed_rng = KeyedRng(device)  # each micro-batch's own RNG stream (``MicroBatch.rng_key``)

    def run(
        self, micro_batches: list[MicroBatch], windows_left: int | None = None, failed: bool = False,
    ) -> WindowResult | str:
        """Forward+backward every micro-batch; ``STOPPED`` when ``should_stop`` asked to stop,
        ``EXHAUSTED`` when (DDP) no rank has a micro-batch left, ``FAILED`` when (DDP/FSDP) a
        rank says ``failed`` (its error before the window: it joins the window's all-reduce
        only to say so). ``windows_left``: how many
        windows this rank's loader has after this one, when its length says so (DDP: every
        rank then knows which window is the epoch's last without one more all-reduce)."""
        agreed = self._agree(micro_batches, windows_left, failed)
        if isinstance(agreed, str):
            return agreed
        total_items, total_samples = agreed.total_items, agreed.total_samples
        weight_factor, manual_sync, passes = agreed.weight_factor, agreed.manual_sync, agreed.passes
        # W == 0 only when every micro-batch is empty too; then every weight is 0 anyway.
        divisor: float | torch.Tensor = (
            torch.where(total_items > 0, total_items, 1)
            if isinstance(total_items, torch.Tensor)
            else (total_items if total_items > 0 else 1)
        )
        # DDP's hooks all-reduce at the last micro-batch's backward; a window that a rank has
        # no micro-batch for runs on the bare module and is averaged at the step instead.
        module = distributed.unwrap(self.model) if manual_sync else self.model
        synced = self.ddp and not manual_sync

        losses: list[torch.Tensor] = []
        counts: list[int | float | torch.Tensor] = []
        last = len(micro_batches) - 1
        inputs: Any = None
        targets: Any = None
        outputs: Any = None
        loss: Any = None
        loaded: Any = None  # the current micro-batch's inputs on the host (OOM template)
        in_sync_backward = False
        feed = self.feed.window(micro_batches)  # inputs on the device one micro-batch at a time
        for index, mb in enumerate(micro_batches):
            # Drop the previous micro-batch's tensors before loading the next, so that only
            # the current micro-batch's inputs are alive (on the device, on CUDA).
            inputs = targets = outputs = loss = loaded = None
            if index and not self.collective and self.should_stop is not None and self.should_stop():
                return STOPPED
            try:
                loaded, inputs, targets = next(feed)
                if self.defer_sync:
                    sharding.defer_gradient_sync(self.model, index < passes - 1)
                # Its forward and backward (a checkpointed recompute) draw from generators
                # seeded by the micro-batch, not the rank; the rank's own states come back after.
                keyed = self.keyed_rng.enter(mb.rng_key)
                try:
                    with distributed.no_sync(self.model, synced and index < last):
                        if self.batchnorm is not None:
                            self.batchnorm.begin(index)
                        with self.precision.autocast():
                            outputs = items.forward(module, inputs)
                            loss = self.loss_fn(outputs, targets)
                        if self.batchnorm is not None:
                            self.batchnorm.end()  # (not a checkpointed recompute's statistics)
                        _check_scalar(loss)
                        in_sync_backward = synced and index == last
                        if self.ddp and self.good_empty is None:
                            self.good_empty = items.one_row(loaded)
                        self._backward(mb, loss, outputs, weight_factor, divisor, losses, counts)
                finally:
                    self.keyed_rng.exit(keyed)
            except Exception as exc:  # noqa: BLE001  (re-raised unless DDP can agree on it)
                error = self._check_droppable(exc, in_sync_backward)
                inputs = targets = outputs = loss = None
                return self._drop_window(micro_batches, loaded, synced, total_items, total_samples, manual_sync,
                                         error)
        if self.sharded:
            self.empty_inputs = items.one_row(loaded) if loaded is not None else self.empty_inputs
            inputs = targets = outputs = loss = loaded = None
            self._zero_weight_passes(len(micro_batches), passes)
        return WindowResult(
            _weighted_sum(losses, counts), total_items, total_samples, len(micro_batches), manual_sync,
            last_window=agreed.last_window,
        )

    def _agree(self, micro_batches: list[MicroBatch], windows_left: int | None, failed: bool = False) -> _Agreement | str:
        """What every rank needs to know before the window's first forward: the window's item
        and sample totals, whether to stop (``STOPPED``) or the epoch is over (``EXHAUSTED``),
        how gradients sync, whether this is the epoch's last window, and (FSDP) how many passes
        every rank runs; one process agrees with itself."""
        local_items: float | torch.Tensor = sum(mb.items for mb in micro_batches)
        local_samples = sum(mb.samples for mb in micro_batches)
        if not self.collective:
            if self.should_stop is not None and self.should_stop():
                return STOPPED
            return _Agreement(local_items, local_samples, 1, False, False, len(micro_batches))
        # One small all-reduce per window; DDP then averages gradients over ranks, which the
        # world_size factor undoes. should_stop is polled here, once per window, so that no rank
        # leaves a window the others are in. Each rank also writes, in its own slot, 1 + the
        # windows its loader has left (0: unknown), and (FSDP) the count of its micro-batches
        # (the window's passes: the largest). FSDP also flags a rank with no micro-batch that
        # has never seen one (a resumed process): it cannot shape its zero-weight passes.
        stop = self.should_stop is not None and self.should_stop()
        shapeless = self.sharded and not micro_batches and self.empty_inputs is None
        world, rank = distributed.world_size(), distributed.rank()
        slots = [0.0] * (2 * world)
        slots[rank] = 0.0 if windows_left is None else windows_left + 1.0
        slots[world + rank] = float(len(micro_batches))
        flags = [1.0 if micro_batches else 0.0, 1.0 if stop else 0.0, 1.0 if shapeless else 0.0,
                 1.0 if failed else 0.0]
        reduced = distributed.all_reduce_sum(
            [local_items, local_samples, *flags, *slots], distributed.comm_device(self.model),
        ).tolist()  # the flags decide what every rank does next: read them here
        total_items, total_samples, ranks_with_data, stops, shapeless_ranks, failures = reduced[:6]
        reduced = reduced[:5] + reduced[6:]
        if failures > 0:
            return FAILED
        if stops > 0:
            return STOPPED
        if ranks_with_data == 0:
            return EXHAUSTED
        if shapeless_ranks > 0:
            self._share_empty_inputs(micro_batches)
        left = reduced[5 : 5 + world]
        return _Agreement(
            total_items, total_samples, world, self.ddp and ranks_with_data < world,
            min(left) > 0 and max(left) == 1, int(max(reduced[5 + world :])),
        )

    def _share_empty_inputs(self, micro_batches: list[MicroBatch]) -> None:
        """FSDP, some rank has no micro-batch in this window and has seen none: every rank
        offers one row of a micro-batch (an earlier one's, or this window's first), and a rank
        without its own takes the first offer (a collective: every rank calls it)."""
        offer = self.empty_inputs
        if offer is None and micro_batches:
            rng = capture_rng_state()  # loading may draw random transforms: the pass loads it again
            offer = items.one_row(micro_batches[0].load()[0])
            restore_rng_state(rng)
        shared = sharding.shared_empty_rows(offer)
        if self.empty_inputs is None:
            self.empty_inputs = shared

    def _check_droppable(self, exc: Exception, in_sync_backward: bool) -> BaseException | None:
        """Re-raise ``exc`` unless it is an out-of-memory error a DDP window can drop (every
        rank then backs off together; returns None), or under DDP another error of this
        rank's micro-batch (returned: the rank drops the window as for an out-of-memory error,
        joins the gradient all-reduce, and every rank raises it at the step, none waiting in a
        collective this rank would not join); single process: the trainer backs off itself."""
        if self.sharded and is_oom(exc):
            raise MicroBatchTooSmall(
                "out of memory inside a sharded (FSDP) window: its ranks cannot back off "
                "together from inside FSDP's collectives; lower micro_batch_size, or shard "
                "with cpu_offload=True or mixed_precision=True"
            ) from None
        if not self.ddp:
            raise exc
        if not is_oom(exc):
            if in_sync_backward:
                raise exc  # inside DDP's all-reduce: the other ranks are in it too
            return exc
        if in_sync_backward:
            raise MicroBatchTooSmall(
                "out of memory inside DDP's gradient all-reduce (the window's last "
                "backward): the ranks cannot back off together from there; lower "
                "micro_batch_size or use precision='bf16'"
            ) from None
        return None

    def _backward(
        self,
        mb: MicroBatch,
        loss: torch.Tensor,
        outputs: Any,
        weight_factor: int,
        divisor: float | torch.Tensor,
        losses: list[torch.Tensor],
        counts: list[int | float | torch.Tensor],
    ) -> None:
        """Backpropagate ``loss x n_i x world / W`` and record the micro-batch's loss."""
        if isinstance(mb.items, torch.Tensor):
            # A count on the device: reading it would be a sync. A micro-batch without items
            # has a 0/0 = NaN mean loss, and NaN x 0 is NaN: select 0 instead (the select's
            # backward sends the loss a zero gradient, which the built-in losses pass on as 0).
            loss = torch.where(mb.items > 0, loss, torch.zeros_like(loss))
            # In float64: an integer count divided as a tensor would be rounded to float32.
            weight: float | torch.Tensor = mb.items.to(torch.float64) * weight_factor / divisor
        elif mb.items == 0:
            # All targets ignored: the mean loss is 0/0. Backpropagate an exact zero through
            # the outputs so DDP still sees every parameter used.
            self.precision.backward(_zero_through(outputs))
            return
        else:
            weight = mb.items * weight_factor / divisor
        losses.append(loss.detach())
        counts.append(mb.items)
        self.precision.backward_weighted(loss, weight)

    def _drop_window(
        self,
        micro_batches: list[MicroBatch],
        loaded: Any,
        synced: bool,
        total_items: float | torch.Tensor,
        total_samples: float | torch.Tensor,
        manual_sync: bool,
        error: BaseException | None = None,
    ) -> WindowResult:
        """DDP, this rank ran out of memory (or ``error`` was raised): drop the window's
        gradients, and join DDP's gradient all-reduce (which the other ranks run at their last
        micro-batch) with an empty batch; the stepper's all-reduce then tells every rank to
        back off (or to raise ``error``)."""
        distributed.unwrap(self.model).zero_grad(set_to_none=True)
        release_memory()
        if synced:
            if error is not None:
                if loaded is None and self.good_empty is None:
                    raise error  # nothing loaded to shape the empty pass with
                self._empty_pass(self.good_empty if self.good_empty is not None else items.one_row(loaded))
                distributed.unwrap(self.model).zero_grad(set_to_none=True)
                return WindowResult(None, total_items, total_samples, len(micro_batches), manual_sync, error=error)
            if loaded is None:
                raise MicroBatchTooSmall(
                    "out of memory while loading a micro-batch under DDP, before any was loaded: "
                    "lower micro_batch_size"
                )
            self._empty_sync_pass(loaded)
        if error is not None:
            return WindowResult(None, total_items, total_samples, len(micro_batches), manual_sync, error=error)
        fatal = max(mb.samples for mb in micro_batches) <= 1
        return WindowResult(None, total_items, total_samples, len(micro_batches), manual_sync,
                            oom=True, oom_fatal=fatal)

    def _empty_sync_pass(self, loaded: Any) -> None:
        """Forward and backward one row times 0 through DDP: every parameter gets a zero
        gradient, so this rank takes part in the gradient all-reduce."""
        self._empty_pass(items.one_row(loaded))
        distributed.unwrap(self.model).zero_grad(set_to_none=True)

    def _zero_weight_passes(self, done: int, passes: int) -> None:
        """FSDP: the passes this rank lacks to join the window's all-gathers and
        reduce-scatters, each on one row times 0 (an exact zero gradient); the last one syncs. A
        rank that has seen no micro-batch got its row from another (``_share_empty_inputs``)."""
        for index in range(done, passes):
            if self.defer_sync:
                sharding.defer_gradient_sync(self.model, index < passes - 1)
            self._empty_pass(self.empty_inputs)

    def _empty_pass(self, empty_inputs: Any) -> None:
        """Forward and backward one row of an earlier micro-batch with an exact zero loss
        (outputs x 0: every gradient exactly 0), in eval mode (a BatchNorm refuses one row in
        train mode; dropout draws nothing). One row, not 0: some models (Hugging Face
        attention) cannot reshape an empty batch. Modes and buffers are put back afterwards."""
        module = distributed.unwrap(self.model)
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
        modes = [(m, m.training) for m in module.modules()]
        inputs = items.to_device(empty_inputs, self.device)
        module.eval()
        try:
            with self.precision.autocast():
                outputs = items.forward(self.model, inputs)
            self.precision.backward(_zero_through(outputs))
        finally:
            for module_, training in modes:
                module_.training = training
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)


def _check_scalar(loss: Any) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(
            "loss_fn must return a scalar mean over the micro-batch's items; got "
            f"{type(loss).__name__} of shape {getattr(loss, 'shape', None)}. "
            "Use reduction='mean'"
        )


def _weighted_sum(
    losses: list[torch.Tensor], counts: list[int | float | torch.Tensor]
) -> float | torch.Tensor | None:
    """sum(loss_i * n_i), in a few ops per window rather than two per micro-batch."""
    if not losses:
        return None
    numbers = not any(isinstance(c, torch.Tensor) for c in counts)
    if numbers and losses[0].is_cpu:
        # On the CPU reading a value is no device sync, and cheaper than tensor ops.
        total = 0.0
        for loss, count in zip(losses, counts, strict=True):
            total += loss.item() * float(count)  # (what float * int converts it to anyway)
        return total
    if numbers:
        scalars = [float(c) for c in counts]
        return torch.stack(torch._foreach_mul(losses, scalars)).sum()
    return torch.stack([loss * count for loss, count in zip(losses, counts, strict=True)]).sum()


def _zero_through(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum() * 0.0
    if isinstance(outputs, Mapping):
        outputs = list(outputs.values())
    elif not isinstance(outputs, list | tuple):
        outputs = list(vars(outputs).values())  # an output object (a dataclass of tensors)
    tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return sum((t.float().sum() * 0.0 for t in tensors), torch.zeros(()))
