"""The spec's memory levers on the built model: LoRA adapters (peft), activation checkpointing,
and the 8-bit optimizer (bitsandbytes), in the order ``build_run`` applies them.

    module = levers.apply(spec, module)          # after building, before DDP/FSDP wrapping
    optimizer = levers.adamw8bit(spec, params)   # spec.optimizer.name == "adamw8bit"
    levers.save_merged(module, directory)        # peft.merge: save_pretrained of base + adapters
    levers.store_merged(module, uploads, job_id)  # ... as <job>/merged.tar in the artifact store
    levers.store_merged(sharded_module, uploads, job_id, rebuild=build)  # FSDP: every rank calls it

LoRA comes first (its adapters are wrapped with their block), checkpointing next, then the
strategy's wrapping (FSDP shards the checkpointed blocks, as torchtitan orders them). peft and
bitsandbytes are optional extras (``finetune``, ``adamw8bit``): a worker without them fails the
job with the extra to install.
"""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from accumcore import checkpoint_activations
from accumcore.activation_checkpointing import checkpointed_blocks
from accumcore.frozen import trainable
from services.artifacts import merged_key, sha256_of
from services.catalog.builders.own_models import Logits
from services.spec import JobSpec
from services.spec.levers import PeftOptions

if TYPE_CHECKING:
    from services.worker.checkpoints.uploads import CheckpointUploads

# Classifier heads a re-made `hf:` classifier trains in full beside the adapters (peft's own
# list for sequence classification): BERT, DeBERTa, ViT name it classifier, GPT-2/Llama score.
HEADS = ("classifier", "score")


def apply(spec: JobSpec, module: nn.Module) -> nn.Module:
    """``module`` with the spec's LoRA adapters and activation checkpointing."""
    if spec.peft is not None:
        module = add_lora(module, spec.peft)
    if spec.activation_checkpointing is not None:
        checkpoint_activations(module, every=spec.activation_checkpointing.every)
    return module


def add_lora(model: nn.Module, options: PeftOptions) -> nn.Module:
    """LoRA adapters on ``model`` (a transformers model, or the catalog's ``Logits`` around
    one, whose head is then trained in full); every other parameter frozen."""
    try:
        import peft
    except ImportError as exc:
        raise ValueError("peft (LoRA) is not installed on this worker: install the finetune extra "
                         "(pip install 'accum[finetune]'), or leave peft out of the spec") from exc
    inner = model.inner if isinstance(model, Logits) else model
    heads = [name for name in HEADS if isinstance(getattr(inner, name, None), nn.Module)] if inner is not model else []
    config = peft.LoraConfig(r=options.r, lora_alpha=options.alpha, lora_dropout=options.dropout,
                             target_modules=options.target_modules, modules_to_save=heads or None)
    try:
        wrapped = peft.get_peft_model(inner, config)
    except ValueError as exc:  # no target modules given and none known for the model type
        raise ValueError(f"peft: {exc}; name the layers to adapt in peft.target_modules (e.g. "
                         '["q_proj", "v_proj"]) or use "all-linear"') from exc
    if inner is not model:
        model.inner = wrapped
        return model
    return wrapped


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """What the optimizer steps: LoRA's adapters (and head) only, else every parameter."""
    return trainable(module)


def notes(spec: JobSpec, module: nn.Module) -> list[tuple[str, str, dict[str, Any]]]:
    """The levers as the job's events: blocks checkpointed, parameters trained and frozen."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    if spec.activation_checkpointing is not None:
        blocks = checkpointed_blocks(module)
        found.append(("activation_checkpointing", f"activation checkpointing on {blocks} block(s): "
                      "their activations are recomputed in the backward (same dropout masks)",
                      {"blocks": blocks, "every": spec.activation_checkpointing.every}))
    if spec.peft is not None:
        total = sum(p.numel() for p in module.parameters())
        trained = sum(p.numel() for p in trainable(module))
        found.append(("lora", f"LoRA r {spec.peft.r}: {trained:,} of {total:,} parameters trained "
                      f"({100 * trained / max(total, 1):.2f}%); checkpoints hold those only",
                      {"trainable": trained, "total": total, "r": spec.peft.r}))
    return found


def adamw8bit(spec: JobSpec, params: Any, device: str) -> torch.optim.Optimizer:
    """bitsandbytes' ``AdamW8bit`` (states in 8 bits, block-wise quantised), CUDA only."""
    if not device.startswith("cuda"):
        raise ValueError(f"optimizer adamw8bit runs on CUDA GPUs only and this job trains on {device}: "
                         "use adamw, or run it on a queue whose workers have GPUs (gpus >= 1)")
    try:
        import bitsandbytes
    except ImportError as exc:
        raise ValueError("optimizer adamw8bit needs bitsandbytes on this worker: install the adamw8bit "
                         "extra (pip install 'accum[adamw8bit]'), or use adamw") from exc
    opt = spec.optimizer
    betas = (float(opt.betas[0]), float(opt.betas[1])) if opt.betas else (0.9, 0.999)
    optimizer: torch.optim.Optimizer = bitsandbytes.optim.AdamW8bit(
        params, lr=opt.lr, betas=betas, weight_decay=opt.weight_decay)
    return optimizer


def save_merged(module: nn.Module, directory: Path, *, in_place: bool = False) -> Path:
    """The adapters merged into a copy of the base (into ``module`` itself with ``in_place``:
    a copy made for this), written with ``save_pretrained`` (loads with ``from_pretrained``,
    no peft needed); returns ``directory``."""
    import copy

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    model: Any = module.inner if isinstance(module, Logits) else module
    model = model if in_place else copy.deepcopy(model)
    for parent in list(model.modules()):  # checkpointing changes no weight: unwrap the blocks
        for attribute, child in list(parent.named_children()):
            if isinstance(child, CheckpointWrapper):
                setattr(parent, attribute, child._checkpoint_wrapped_module)
    merged: Any = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    merged.config.use_cache = type(merged.config)().use_cache  # checkpointing turned it off
    merged.save_pretrained(directory)
    return directory


def store_merged(module: nn.Module, uploads: CheckpointUploads | None, job_id: str,
                 rebuild: Callable[[], nn.Module] | None = None) -> str:
    """``save_merged`` packed as one tar (``tar xf`` it, then ``from_pretrained`` the folder)
    and stored at ``merged_key(job_id)`` by the rank that has ``uploads`` (rank 0; the others
    pass None); returns the key.

    A sharded (FSDP) ``module`` is gathered whole first, a collective every rank calls
    (``full_state``); rank 0 then loads it into ``rebuild()`` (the spec's model as the worker
    builds it, unsharded, on the CPU) with the spec's LoRA adapters, and merges that."""
    from accumcore.sharding import is_sharded

    original = module
    if is_sharded(module):
        state = full_state(module)  # every rank; rank 0 alone ends up holding it
        if uploads is None:
            return merged_key(job_id)
        if rebuild is None:
            raise ValueError("a sharded model's merge needs the model rebuilt unsharded (rebuild)")
        module = rebuilt(rebuild, state)
        del state
    if uploads is None:
        return merged_key(job_id)
    uploads.staging_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=uploads.staging_dir) as folder:
        merged = save_merged(module, Path(folder) / "merged", in_place=module is not original)
        packed = Path(folder) / "merged.tar"
        with tarfile.open(packed, "w") as tar:
            tar.add(merged, arcname="merged")
        sha256, size = sha256_of(packed)
        uploads.put(merged_key(job_id), packed, sha256, size)
        # Its hash beside it (a local store keeps none): the download's ETag, which clients verify.
        note = Path(folder) / "merged.tar.sha256"
        note.write_text(sha256)
        uploads.put(merged_key(job_id) + ".sha256", note, *sha256_of(note))
    return merged_key(job_id)


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The sharded ``module``'s whole state by its plain names (checkpoint wrappers left out),
    gathered one parameter at a time onto rank 0's CPU (the other ranks get nothing): a
    collective, every rank of the process group calls it. Only at a merge, the job's end."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)


def rebuilt(rebuild: Callable[[], nn.Module], state: dict[str, torch.Tensor]) -> nn.Module:
    """``rebuild()`` (the spec's model, with its LoRA adapters) holding ``state``, every key of
    it (strict), its tensors taken as they are (``assign``: no second copy, the trained dtype):
    the unsharded copy of the trained model that ``save_merged`` merges in place."""
    module = rebuild()
    module.load_state_dict(state, strict=True, assign=True)
    tie = getattr(module.inner if isinstance(module, Logits) else module, "tie_weights", None)
    if callable(tie):
        tie()  # assign put a parameter object of its own at each tied name (GPT-2's lm_head, wte)
    return module
