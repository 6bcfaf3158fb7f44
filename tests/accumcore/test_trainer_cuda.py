"""CUDA-only behaviour: one device sync per optimizer step, and the peak-memory metric.

These cannot run on a CPU-only machine (there is no device to synchronise with and no CUDA
allocator); they skip there with that reason and run wherever a GPU is present.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from trainer_reference import class_dataset, class_model

from accumcore import Trainer
from accumcore.data import make_loader

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA-only: device syncs and CUDA peak memory need a GPU"
)


def test_at_most_one_device_sync_per_window_and_peak_memory_reported() -> None:
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=4, device="cuda")
    loader = make_loader(class_dataset(64, torch.float32), 4)
    trainer.fit(loader, epochs=1)  # warm-up: CUDA context, kernels, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = trainer.fit(loader, epochs=2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    # 16 micro-batches, 4 windows in the epoch: one sync per window, none per micro-batch.
    assert len(history.steps) == 4
    assert len(syncs) <= len(history.steps), [str(w.message) for w in syncs]
    assert all(s["peak_memory_bytes"] > 0 for s in history.steps)


def _peak_with_prefetcher(n_acc: int, m: int = 8) -> int:
    """Peak CUDA memory of one epoch fed by the fast path's streaming loader (pinned memory,
    CudaPrefetcher) with a tiny model, so that the inputs are most of the memory."""
    from accumcore.device_data import fast_loader

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 3))
    dataset = torch.utils.data.TensorDataset(torch.randn(m * 16, 3, 64, 64), torch.randint(0, 3, (m * 16,)))
    loader = fast_loader(dataset, m, seed=0, device="cuda", name="not-small")
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=n_acc, device="cuda")
    trainer.fit(loader, epochs=1)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    trainer.fit(loader, epochs=2)
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def test_a_window_read_ahead_through_the_prefetcher_stays_on_the_host() -> None:
    # Issue 19 item 1: the prefetcher used to copy every batch of a window read ahead.
    micro_batch = 8 * 3 * 64 * 64 * 4
    one, sixteen = _peak_with_prefetcher(1), _peak_with_prefetcher(16)
    assert sixteen - one < micro_batch  # not 15 more micro-batches: at most one in flight


def test_a_real_cuda_out_of_memory_is_classified_and_its_cache_released() -> None:
    from accumcore.oom import is_oom, release_memory

    held = torch.empty(64 * 2**20, device="cuda")  # 256 MiB, a segment of its own
    del held  # a cached block the release must give back
    cached = torch.cuda.memory_reserved()
    try:
        torch.empty(2**50, dtype=torch.uint8, device="cuda")
    except RuntimeError as exc:
        assert is_oom(exc)
    else:  # pragma: no cover - no device has a petabyte
        raise AssertionError("a petabyte was allocated")
    release_memory()
    # Earlier tests in this process may still hold live tensors: those segments stay reserved.
    assert torch.cuda.memory_reserved() <= cached - 64 * 2**20 * 4


def test_cuda_generator_states_round_trip_through_a_checkpoint_state() -> None:
    from accumcore.rng import capture_rng_state, restore_rng_state, serialise_rng_state

    torch.cuda.manual_seed_all(3)
    torch.rand(1, device="cuda")  # CUDA in use: its states are captured
    state = serialise_rng_state(capture_rng_state())
    assert state["cuda_device"] == torch.cuda.current_device()
    first = torch.rand(4, device="cuda")
    restore_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), first)


def test_bf16_is_accepted_exactly_where_the_gpu_has_it_natively() -> None:
    from accumcore.precision import Precision, UnsupportedPrecision

    if torch.cuda.get_device_capability() >= (8, 0):
        assert Precision("bf16", torch.device("cuda")).name == "bf16"
    else:
        with pytest.raises(UnsupportedPrecision, match="fp16"):
            Precision("bf16", torch.device("cuda"))


def test_peak_memory_is_per_step_and_the_evaluation_has_its_own() -> None:
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      device="cuda")
    small = make_loader(class_dataset(8, torch.float32), 2)
    big_val = make_loader(class_dataset(4096, torch.float32), 4096, shuffle=False)
    history = trainer.fit(small, epochs=2, val_loader=big_val)
    eval_peak = history.evals[0]["val_peak_memory_bytes"]
    # A running maximum would carry the first evaluation's batch into the next epoch's steps.
    assert all(s["peak_memory_bytes"] < eval_peak for s in history.steps[4:])


def test_the_worker_names_its_gpus_without_a_cuda_context() -> None:
    import subprocess
    import sys

    code = ("import torch; from services.worker.offer import describe_gpu; name = describe_gpu(); "
            "assert not torch.cuda.is_initialized(), 'a CUDA context'; print(name)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.cuda.get_device_name(0) in done.stdout


def test_the_auto_micro_batch_probe_measures_each_sizes_own_peak() -> None:
    # The trainer takes and resets CUDA's peak counter at every optimizer step: a probe that
    # read the counter after its window saw the same bytes for every size and picked the
    # largest m under any limit (found on an H100; the CPU path measures differently).
    from accumcore.auto_batch import find_micro_batch_size, measure_footprint

    # Activations dominate (about 2 MB a sample), not the optimizer step's transients, which
    # are the same for every size (with a wide Linear they were the peak of every probe).
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, 3)).cuda()

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(k, 3, 64, 64), torch.randint(0, 3, (k,))

    sample = 3 * 64 * 64 * 4  # one sample's input bytes
    small, big = (measure_footprint(model, batch, m, "cuda", accumulation_steps=256 // m) for m in (1, 256))
    assert small is not None and big is not None
    assert big - small >= 200 * sample  # the big micro-batch's inputs, at the least
    limit = big - 64 * sample  # m=256 does not fit; what does is the search's to find
    assert find_micro_batch_size(model, batch, 256, "cuda", memory_limit_bytes=limit) < 256


def test_the_per_step_peak_is_the_allocators_max_memory_allocated() -> None:
    """``metrics.peak_memory_bytes`` reads the allocator's nested stats at one key instead of
    ``max_memory_allocated``'s flattened dict: the same figure, after a known allocation."""
    from accumcore import metrics

    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats(device)
    block = torch.empty(3 << 20, dtype=torch.uint8, device=device)
    del block
    assert metrics.peak_memory_bytes(device) == float(torch.cuda.max_memory_allocated(device))
    assert metrics.peak_memory_bytes(device) >= 3 << 20
