"""Models from the namespaces and plugins: `timm:<name>`, `hf:<model_type>`, `hf:/dir`, plugins.

Needs the `models` extra (`pip install 'accum[models]'`: timm, transformers); `build.py`
imports this module only for such names, so a worker without the extra still serves the
catalog. Every refusal names what was given and what would work, and happens when the job
starts, before any step.

Hugging Face models take keyword batches (`model(**inputs)`); a causal LM is scored by
`CausalLMLoss` on `labels[..., 1:]` (the trainer counts those: `shift_labels=True`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from services.catalog.builders.text import IGNORE_INDEX
from services.catalog.contained import check_links
from services.catalog.entries import DatasetInfo, ModelInfo
from services.catalog.families.plugins import MODEL_GROUP, installed

# A timm checkpoint in the Hugging Face cache is one of these files of the model's hub repo.
TIMM_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def build_timm(info: ModelInfo, dataset: DatasetInfo, options: Mapping[str, Any]) -> nn.Module:
    """`timm.create_model(name, pretrained, num_classes=<dataset's>, **other options)`.

    pretrained: from `weights` (a file) or the node's Hugging Face cache, never downloaded;
    a classifier of another size is dropped by timm and re-initialised (said in the event)."""
    import timm

    name = info.name.partition(":")[2]
    kwargs = {k: v for k, v in options.items() if k not in ("pretrained", "weights")}
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=8, cutoff=0.6)
        raise ValueError(
            f"timm has no model {name!r} (timm {timm.__version__}); "
            + (f"close names: {', '.join(close)}; " if close else "")
            + "every name: python -c 'import timm; print(timm.list_models())'"
        )
    pretrained = bool(options.get("pretrained", False))
    overlay = {"file": _timm_weights(name, options.get("weights"))} if pretrained else None
    if dataset.channels is not None:
        kwargs.setdefault("in_chans", dataset.channels)
    try:
        return timm.create_model(name, pretrained=pretrained, num_classes=dataset.num_classes,
                                 pretrained_cfg_overlay=overlay, **kwargs)
    except TypeError as exc:
        raise ValueError(f"timm model {name!r} refused options {sorted(kwargs)}: {exc}") from exc


def _timm_weights(name: str, weights: str | None) -> str:
    """The weights file for a pretrained timm model: `weights`, or the cached hub file."""
    if weights is not None:
        if not Path(weights).is_file():
            raise ValueError(f"pretrained weights for timm model {name!r}: no file at weights={weights!r}")
        return weights
    import timm
    from huggingface_hub import constants, try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    repo = cfg.hf_hub_id if cfg is not None else None
    tried = []
    if repo:
        for filename in TIMM_WEIGHT_FILES:
            found = try_to_load_from_cache(repo, filename)
            if isinstance(found, str):
                return found
            tried.append(f"{repo}/{filename}")
    where = f"{', '.join(tried)} in the Hugging Face cache {constants.HF_HUB_CACHE}" if tried else (
        f"timm {timm.__version__} knows no hub weights for {name!r}")
    raise ValueError(
        f"pretrained weights for timm model {name!r} are not on this node (tried {where}; weights "
        'are never downloaded by a job). Put the file under a data root and set "weights": '
        '"/path/model.safetensors", or pre-fill the cache on the node, or set "pretrained": false'
    )


class CausalLMLoss(nn.Module):
    """Mean cross-entropy of `logits[..., :-1, :]` against `labels[..., 1:]`, ignoring -100.

    The model's own loss would do the same, but upcasts the logits to float32 (so a float64
    check could not be exact) and computes a loss nobody reads when the trainer weighs it."""

    reduction = "mean"
    ignore_index = IGNORE_INDEX

    def forward(self, outputs: Any, labels: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        shifted = logits[..., :-1, :]
        return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels[..., 1:].reshape(-1),
                               ignore_index=IGNORE_INDEX)


class Logits(nn.Module):
    """A Hugging Face classifier that returns its logits, so the catalog's loss applies and
    validation accuracy is computed: `Logits(vit)(pixels)`, `Logits(bert)(input_ids=...,
    attention_mask=...)` (a keyword batch, as the trainer passes a mapping of inputs)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor, **keywords: torch.Tensor) -> torch.Tensor:
        return self.inner(*inputs, **keywords).logits


def _hf_task(dataset: DatasetInfo) -> str:
    """The transformers auto class for the dataset: its task and what its inputs are."""
    if dataset.task == "language_modeling":
        return "AutoModelForCausalLM"
    if dataset.text_classification:
        return "AutoModelForSequenceClassification"
    return "AutoModelForImageClassification"


def build_hf(info: ModelInfo, dataset: DatasetInfo, options: Mapping[str, Any]) -> nn.Module:
    """A transformers model for the dataset's task: a causal LM for text, a sequence
    classifier for text with labels, an image classifier for images (both wrapped by
    `Logits`). `hf:<model_type>` from its config class with `options` as overrides; `hf:/dir`
    from a saved model, its classifier head re-made for the dataset's classes."""
    import transformers

    target = info.name.partition(":")[2]
    task = dataset.task
    auto = getattr(transformers, _hf_task(dataset))
    if target.startswith("/"):
        if not (Path(target) / "config.json").is_file():
            raise ValueError(f"model {info.name!r}: no saved Hugging Face model in {target} (config.json missing)")
        check_links(Path(target), "saved model file")  # from_pretrained opens what the links name
        extra: dict[str, Any] = {} if task == "language_modeling" else {
            "num_labels": dataset.num_classes, "ignore_mismatched_sizes": True}
        if dataset.text_classification:
            extra["pad_token_id"] = dataset.pad_token_id
        model = auto.from_pretrained(target, **extra)
        if dataset.text_classification:
            _check_vocabulary(info.name, model.config, dataset)
    else:
        config = _hf_config(target, dataset, options)
        try:
            model = auto.from_config(config)
        except ValueError as exc:
            raise ValueError(f"model {info.name!r} cannot be built for {task.replace('_', ' ')}: {exc}") from exc
        except (TypeError, RuntimeError) as exc:
            raise ValueError(f"model {info.name!r} with options {dict(options)}: {exc}") from exc
    return model if task == "language_modeling" else Logits(model)


def _hf_config(model_type: str, dataset: DatasetInfo, options: Mapping[str, Any]) -> Any:
    import transformers

    try:
        default = transformers.AutoConfig.for_model(model_type)
    except ValueError:
        known = sorted(transformers.CONFIG_MAPPING.keys())
        close = difflib.get_close_matches(model_type, known, n=8)
        # Hundreds of types: the close ones, and how to see the rest, fit a terminal's line.
        raise ValueError(
            f"transformers {transformers.__version__} has no model_type {model_type!r}; "
            + (f"close: {', '.join(close)}; " if close else "")
            + f"{len(known)} model types, listed by "
            "python -c 'import transformers; print(*sorted(transformers.CONFIG_MAPPING))'"
        ) from None
    keys = set(default.to_dict())
    unknown = sorted(set(options) - keys)
    if unknown:
        raise ValueError(
            f"hf:{model_type} config has no option(s) {', '.join(unknown)}; its options: {', '.join(sorted(keys))}"
        )
    for key, value in options.items():
        current = getattr(default, key, None)
        if current is not None and not isinstance(value, type(current)) and not (
            isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool)):
            raise ValueError(
                f"hf:{model_type} option {key} must be {type(current).__name__} like its default "
                f"{current!r}; got {value!r}"
            )
    overrides = dict(options)
    if dataset.vocab_size is not None:  # token ids: a causal LM or a sequence classifier
        vocab = overrides.setdefault("vocab_size", dataset.vocab_size)
        if vocab < dataset.vocab_size:
            raise ValueError(f"hf:{model_type} vocab_size {vocab} is smaller than the tokenizer's {dataset.vocab_size}"
                             + (" (with its padding id)" if dataset.text_classification else ""))
        # A decoder's classifier reads the last token that is not padding: the data's pad id.
        if dataset.text_classification and overrides.setdefault("pad_token_id", dataset.pad_token_id) != (
                dataset.pad_token_id):
            raise ValueError(f"hf:{model_type} pad_token_id must be the data's padding id {dataset.pad_token_id}"
                             f" (or left out); got {overrides['pad_token_id']!r}")
        # GPT-2's special ids (50256) lie outside a small tokenizer's vocabulary: the batches
        # carry their own ids and padding, so drop those defaults instead of keeping bad ones.
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            special = getattr(default, key, None)
            if key not in overrides and isinstance(special, int) and special >= vocab:
                overrides[key] = None
        for key in ("n_positions", "max_position_embeddings"):
            limit = overrides.get(key, getattr(default, key, None))
            if isinstance(limit, int) and dataset.max_seq_len and limit < dataset.max_seq_len:
                raise ValueError(f"hf:{model_type} {key} {limit} is below the dataset's max_len {dataset.max_seq_len}")
    if dataset.task == "classification":
        overrides.setdefault("num_labels", dataset.num_classes)
        if dataset.channels is not None and "num_channels" in keys:
            overrides.setdefault("num_channels", dataset.channels)
        if dataset.image_size is not None and "image_size" in keys:
            overrides.setdefault("image_size", dataset.image_size)
    return transformers.AutoConfig.for_model(model_type, **overrides)


def _check_vocabulary(name: str, config: Any, dataset: DatasetInfo) -> None:
    """A saved model must embed every id of the data (its tokens and the padding id)."""
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and dataset.vocab_size is not None and vocab < dataset.vocab_size:
        raise ValueError(
            f"model {name!r} embeds {vocab} token ids but the data's tokenizer uses {dataset.vocab_size} "
            f"(padding id {dataset.pad_token_id} included): use the tokenizer the model was saved with "
            "(tokenizer: its directory), or a model with a larger vocab_size"
        )


def build_plugin(info: ModelInfo, dataset: DatasetInfo, options: Mapping[str, Any]) -> nn.Module:
    """An `accum.models` entry point called as `fn(dataset_info, **options)` -> nn.Module."""
    entry = installed(MODEL_GROUP).get(info.name)
    if entry is None:
        raise ValueError(f"plugin model {info.name!r} is not installed on this worker")
    model = entry.load()(dataset, **options)
    if not isinstance(model, nn.Module):
        raise TypeError(f"plugin model {info.name!r} ({entry.value}) returned {type(model).__name__}, not a torch.nn.Module")
    return model

