"""The fast path keeps the math: fused/foreach optimizers, device-resident data, compile.

Each speed-up is checked against the plain computation it replaces, on CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accumcore import fast_path
from accumcore.data import make_loader
from accumcore.device_data import DeviceBatches, fits_on_device


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        y = torch.randint(0, 3, (8,), generator=generator)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


OPTIMIZER_CASES = [
    ("sgd", {"momentum": 0.9, "weight_decay": 1e-2}),
    ("adam", {"weight_decay": 1e-2}),
    ("adamw", {"weight_decay": 1e-2}),
]


@pytest.mark.parametrize(("name", "options"), OPTIMIZER_CASES)
def test_foreach_optimizer_is_bitwise_equal_to_the_plain_one(name: str, options: dict) -> None:
    plain_model, fast_model = _model(), _model()
    plain = fast_path.make_optimizer(name, plain_model.parameters(), 0.05, fast=False, **options)
    fast = fast_path.make_optimizer(name, fast_model.parameters(), 0.05, device="cpu", **options)
    assert fast.defaults["foreach"] is True and not plain.defaults["foreach"]
    _train(plain_model, plain)
    _train(fast_model, fast)
    for a, b in zip(plain_model.parameters(), fast_model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("name", "options"), OPTIMIZER_CASES)
def test_fused_cpu_optimizer_matches_the_plain_one(name: str, options: dict) -> None:
    plain_model, fused_model = _model(), _model()
    plain = fast_path.make_optimizer(name, plain_model.parameters(), 0.05, fast=False, **options)
    fused = fast_path.make_optimizer(
        name, fused_model.parameters(), 0.05, device="cpu", exact=False, **options
    )
    assert fused.defaults["fused"] is True
    _train(plain_model, plain)
    _train(fused_model, fused)
    for a, b in zip(plain_model.parameters(), fused_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_make_optimizer_rejects_unknown_names_and_bad_lr() -> None:
    params = list(_model().parameters())
    with pytest.raises(ValueError, match="not one of sgd, adam, adamw"):
        fast_path.make_optimizer("lamb", params, 0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        fast_path.make_optimizer("sgd", params, 0.0)


def test_prepare_builds_a_working_model_and_optimizer_on_cpu() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
    prepared, optimizer = fast_path.prepare(model, {"name": "adamw", "lr": 1e-3}, "cpu", "bf16")
    # channels_last is CUDA-only: on CPU the weights keep their contiguous layout.
    assert prepared[0].weight.is_contiguous()
    assert optimizer.param_groups[0]["params"][0] is prepared[0].weight
    with pytest.raises(ValueError, match="precision must be one of"):
        fast_path.prepare(model, {"name": "sgd", "lr": 0.1}, "cpu", "fp8")
    with pytest.raises(ValueError, match="needs 'name' and 'lr'"):
        fast_path.prepare(model, {"lr": 0.1}, "cpu")


def test_loader_kwargs_pin_only_for_cuda_and_persist_only_with_workers() -> None:
    assert fast_path.loader_kwargs("cpu", 0) == {"num_workers": 0, "pin_memory": False}
    with_workers = fast_path.loader_kwargs("cuda", 2)
    assert with_workers["pin_memory"] and with_workers["persistent_workers"]
    dataset = TensorDataset(torch.arange(10.0))
    assert len(list(DataLoader(dataset, batch_size=4, **fast_path.loader_kwargs("cpu")))) == 3
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        fast_path.loader_kwargs("cpu", -1)


def test_prefetcher_on_cpu_yields_the_loaders_batches_and_forwards_attributes() -> None:
    loader = make_loader(TensorDataset(torch.arange(10.0), torch.arange(10)), 3, seed=4)
    prefetched = fast_path.CudaPrefetcher(loader, "cpu")
    assert len(prefetched) == 4 and prefetched.batch_sampler is loader.batch_sampler
    for (a, b), (c, d) in zip(prefetched, loader, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


def _dataset(n: int = 23) -> TensorDataset:
    return TensorDataset(torch.randn(n, 4, generator=torch.Generator().manual_seed(2)), torch.arange(n))


def _targets(batches) -> list[list[int]]:
    return [y.tolist() for _x, y in batches]


def test_device_batches_follow_make_loaders_order_epoch_by_epoch() -> None:
    dataset = _dataset()
    host = make_loader(dataset, 5, seed=7)
    device = DeviceBatches.from_dataset(dataset, 5, seed=7, device="cpu")
    assert len(device) == len(host) == 5
    orders = []
    for epoch in (0, 1):
        host.batch_sampler.set_epoch(epoch)
        device.batch_sampler.set_epoch(epoch)
        expected = _targets(host)
        assert _targets(device) == expected
        assert sorted(sum(expected, [])) == list(range(23))  # a permutation, last batch short
        orders.append(expected)
    assert orders[0] != orders[1]
    # The same (seed, epoch) gives the same order in a fresh object; another seed does not.
    again = DeviceBatches.from_dataset(dataset, 5, seed=7)
    assert _targets(again) == orders[0]
    assert _targets(DeviceBatches.from_dataset(dataset, 5, seed=8)) != orders[0]


def test_device_batches_resume_mid_epoch_from_the_sampler_state() -> None:
    dataset = _dataset()
    full = DeviceBatches.from_dataset(dataset, 4, seed=3)
    full.batch_sampler.set_epoch(2)
    uninterrupted = _targets(full)
    resumed = DeviceBatches.from_dataset(dataset, 4, seed=0)
    resumed.batch_sampler.load_state_dict(full.batch_sampler.state_dict())
    resumed.batch_sampler.skip_batches(2)
    assert _targets(resumed) == uninterrupted[2:]
    # The skip is consumed once: the next pass is the whole epoch again.
    assert _targets(resumed) == uninterrupted


def test_device_batches_refuse_bad_input_with_the_fix() -> None:
    with pytest.raises(ValueError, match="same length"):
        DeviceBatches(torch.zeros(3, 2), torch.zeros(4), 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        DeviceBatches(torch.zeros(3, 2), torch.zeros(3), 0)
    assert fits_on_device(10**12, "cpu")


def _accumulated_grads(model: nn.Module, micro_batches) -> list[torch.Tensor]:
    total = sum(len(y) for _x, y in micro_batches)
    for x, y in micro_batches:
        loss = nn.functional.cross_entropy(model(x), y) * (len(y) / total)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.slow
def test_compile_runs_an_accumulation_window_or_falls_back_with_a_reason() -> None:
    eager = _model()
    compiled_model = copy.deepcopy(eager)
    generator = torch.Generator().manual_seed(5)
    micro_batches = [
        (torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator))
        for _ in range(2)
    ]
    reason = fast_path.compile_available()
    result = fast_path.maybe_compile(compiled_model, True)
    if reason is not None:
        # No toolchain: the model is returned as it was, and the reason is said.
        assert not result.compiled and result.reason == reason and result.model is compiled_model
        return
    assert result.compiled and result.reason == "compiled"
    expected = _accumulated_grads(eager, micro_batches)
    got = _accumulated_grads(result.model, micro_batches)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # state_dict keys are unchanged, so checkpoints stay loadable by an eager model.
    assert set(result.model.state_dict()) == set(eager.state_dict())


def test_compile_not_requested_is_a_no_op() -> None:
    model = _model()
    result = fast_path.maybe_compile(model, False)
    assert result.model is model and not result.compiled and result.reason == "not requested"


def test_cuda_choices_channels_last_and_fused_kernels_keep_the_values() -> None:
    # The CUDA decisions are made from the device name, so they can be checked on CPU tensors.
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 2 * 2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    converted = fast_path.use_channels_last(model, "cuda")
    assert converted[0].weight.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(before, converted.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fast_path.use_channels_last(nn.Linear(2, 2), "cuda").weight.is_contiguous()
    opted_in = fast_path.use_channels_last(nn.Sequential(nn.Conv2d(3, 4, 3)), "cpu", on_cpu=True)
    assert opted_in[0].weight.is_contiguous(memory_format=torch.channels_last)
    optimizer = fast_path.make_optimizer("adamw", converted.parameters(), 1e-3, device="cuda")
    assert optimizer.defaults["fused"] is True
    plain = fast_path.make_optimizer("adamw", converted.parameters(), 1e-3, device="cuda", fast=False)
    assert not plain.defaults["fused"] and not plain.defaults["foreach"]


def _fit_on_device_batches(stop_after: int | None) -> list[torch.Tensor]:
    """Train 2 epochs on DeviceBatches; optionally stop after k steps and resume in new objects."""
    from accumcore import Trainer

    dataset = _dataset()

    def build() -> tuple[Trainer, DeviceBatches]:
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(4, 12), nn.Tanh(), nn.Linear(12, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        trainer = Trainer(model, optimizer, loss_fn=nn.MSELoss(), accumulation_steps=2,
                          count_items=lambda x, y: len(y))
        return trainer, DeviceBatches.from_dataset(
            TensorDataset(dataset.tensors[0], dataset.tensors[0][:, :3] * 0.5), 4, seed=9
        )

    trainer, batches = build()
    if stop_after is not None:
        trainer.fit(batches, epochs=2, max_steps=stop_after)
        state = trainer.state_dict()
        trainer, batches = build()
        trainer.load_state_dict(state)
    trainer.fit(batches, epochs=2)
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_trainer_on_device_batches_resumes_bitwise() -> None:
    uninterrupted = _fit_on_device_batches(None)
    resumed = _fit_on_device_batches(2)  # 6 batches per epoch, N=2: mid-epoch of epoch 0
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(a, b)


def test_fast_loader_gives_make_loaders_batches_on_either_path() -> None:
    from accumcore.device_data import fast_loader

    dataset = _dataset()
    expected = _targets(make_loader(dataset, 5, seed=3))
    held = fast_loader(dataset, 5, seed=3, name="digits")
    streamed = fast_loader(dataset, 5, seed=3, name="text")
    assert isinstance(held, DeviceBatches)
    assert isinstance(streamed, fast_path.CudaPrefetcher)
    assert _targets(held) == _targets(streamed) == expected
