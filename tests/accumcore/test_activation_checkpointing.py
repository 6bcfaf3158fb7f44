"""Activation checkpointing keeps the run exact (``accumcore.activation_checkpointing``).

CPU, float64, dropout on, windows of 3 micro-batches with a short last one: a checkpointed
run ends bitwise equal to the plain run (parameters and BatchNorm statistics), for an MLP of
blocks and for a tiny GPT-2 built from its config. The control: the same checkpointing
without the preserved RNG state (torchtitan's ``preserve_rng_state=False``) ends elsewhere,
so the comparison can differ. And the auto micro-batch probe, measuring the model as it trains,
picks a larger m for the checkpointed one under the same memory cap.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from accumcore import Trainer, checkpoint_activations
from accumcore.activation_checkpointing import checkpointed_blocks
from accumcore.data import make_loader


def _mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Tanh()),
        nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.Tanh()),
        nn.Linear(8, 3),
    ).double()


def _train(model: nn.Module, dataset: TensorDataset, loss_fn=None, **options) -> dict[str, torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    trainer = Trainer(model, optimizer, loss_fn=loss_fn or nn.CrossEntropyLoss(), accumulation_steps=3,
                      seed=11, **options)
    trainer.fit(make_loader(dataset, 4, seed=5), epochs=2)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpointed_blocks_train_bitwise_as_the_plain_model() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(30, 6, dtype=torch.float64), torch.randint(0, 3, (30,)))
    plain = _train(_mlp(), data)
    every = checkpoint_activations(_mlp())
    assert checkpointed_blocks(every) == 3
    assert _same(_train(every, data), plain)  # state-dict keys are the plain model's too
    second = checkpoint_activations(_mlp(), every=2)
    assert checkpointed_blocks(second) == 1
    assert _same(_train(second, data), plain)
    # Control: recomputed on whatever the generator holds then, dropout draws other masks.
    control = _mlp()
    for index in range(2):
        control[index] = checkpoint_wrapper(control[index], preserve_rng_state=False)
    assert not _same(_train(control, data), plain)
    with pytest.raises(ValueError, match="checkpointed already"):
        checkpoint_activations(every)


class ShiftedTokenLoss(nn.Module):
    reduction = "mean"

    def forward(self, outputs, labels: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(4)
    config = GPT2Config(vocab_size=13, n_positions=8, n_embd=8, n_layer=2, n_head=2,
                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)
    return GPT2LMHeadModel(config).double()


def test_a_checkpointed_gpt2_with_dropout_trains_bitwise_as_the_plain_one() -> None:
    torch.manual_seed(1)
    tokens = torch.randint(0, 13, (10, 8))
    labels = tokens.clone()
    labels[::3, 5:] = -100  # padded rows: items differ per micro-batch
    data = TensorDataset(tokens, labels)
    plain = _train(_gpt2(), data, ShiftedTokenLoss(), shift_labels=True)
    model = checkpoint_activations(_gpt2())
    assert checkpointed_blocks(model) == 2 and model.config.use_cache is False
    assert _same(_train(model, data, ShiftedTokenLoss(), shift_labels=True), plain)


def test_the_auto_micro_batch_probe_measures_the_checkpointed_model() -> None:
    """micro_batch_size "auto" probes the model as it trains: under the same memory cap the
    checkpointed GPT-2 gets a larger m than the plain one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from accumcore.auto_batch import find_micro_batch_size, measure_footprint

    torch.manual_seed(4)
    plain = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2))
    checkpointed = checkpoint_activations(copy.deepcopy(plain))
    tokens = torch.randint(0, 64, (8, 64))

    def sample(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tokens[:m], tokens[:m]

    loss = ShiftedTokenLoss()
    plain_8, checkpointed_8 = (measure_footprint(model, sample, 8, loss_fn=loss) for model in (plain, checkpointed))
    assert plain_8 is not None and checkpointed_8 is not None and checkpointed_8 < plain_8
    cap = (plain_8 + checkpointed_8) // 2
    assert find_micro_batch_size(plain, sample, 8, loss_fn=loss, memory_limit_bytes=cap) < 8
    assert find_micro_batch_size(checkpointed, sample, 8, loss_fn=loss, memory_limit_bytes=cap) == 8


def test_checkpointed_blocks_sharded_with_fsdp_train_bitwise_as_the_sharded_plain_model(tmp_path) -> None:
    """Checkpointing before ``shard`` (torchtitan's order: FSDP units are the wrapped blocks), in
    a gloo group of one rank: bitwise the same state as the plain model sharded alike."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from accumcore import shard

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(30, 6, dtype=torch.float64), torch.randint(0, 3, (30,)))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        states = []
        for model in (shard(_mlp()), shard(checkpoint_activations(_mlp()))):
            _train(model, data, verify_window=False)
            states.append(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    finally:
        dist.destroy_process_group()
    assert _same(*states)
