"""`hf:<model_type>` (a Hugging Face transformers model from its config class, the listed
options overriding the config) and `hf:<directory under a data root>` (a saved model, no
options: nothing reaches `from_pretrained` from the spec) (torch-free; built by
`own_models.build_hf`, which also checks each option against the model type's own config).
"""

from __future__ import annotations

import re
from typing import Any

from services.catalog.entries import ModelInfo, NameRefused, namespace_family
from services.catalog.option_types import Option, check_model_options

MAX_SIZE = 1 << 20  # a width, depth, head count or vocabulary far beyond one device's memory
FRACTION = Option("number", 0, 1)
SIZE = Option("integer", 1, MAX_SIZE)
TOKEN_ID = Option("integer", 0, MAX_SIZE)
EPSILON = Option("number", 0, 1)

_HF_SIZES = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "max_position_embeddings", "type_vocab_size", "head_dim",
    "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "n_ctx",
    "d_model", "d_ff", "num_layers", "num_heads",
    "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "patch_size", "image_size", "num_channels", "num_labels",
)
_HF_DROPOUTS = (
    "hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
    "summary_first_dropout", "classifier_dropout", "dropout", "attention_dropout", "activation_dropout",
    "hidden_dropout", "dropout_rate",
)
_HF_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu", "swish", "tanh")

# Config overrides of `hf:<model_type>`: architecture sizes, dropouts, norms, activations. The
# worker also checks each against the model type's own config (a key it lacks is refused there).
HF_CONFIG_OPTIONS: dict[str, Option] = {
    **dict.fromkeys(_HF_SIZES, SIZE),
    **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id"), TOKEN_ID),
    **dict.fromkeys(_HF_DROPOUTS, FRACTION),
    **dict.fromkeys(("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps"), EPSILON),
    "initializer_range": Option("number", 0, 10),
    "rope_theta": Option("number", 1, 1e9),
    "tie_word_embeddings": Option("boolean"),
    "qkv_bias": Option("boolean"),
    "hidden_act": Option("choice", choices=_HF_ACTIVATIONS),
    "activation_function": Option("choice", choices=_HF_ACTIVATIONS),
    "position_embedding_type": Option("choice", choices=("absolute", "relative_key", "relative_key_query")),
}
DESCRIPTION = (
    "hf:<model_type>: a Hugging Face transformers model built from its config class, the "
    "listed options override the config; hf:<directory under a data root>: a saved model "
    "(no options)"
)
_HF_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_\-]*")


def model_path(name: str) -> str | None:
    """The directory an `hf:/...` model is loaded from (checked against the data roots)."""
    return name[3:] if name.startswith("hf:/") else None


def find(name: str) -> ModelInfo:
    rest = name.partition(":")[2]
    if rest.startswith("/"):
        return ModelInfo(name=name, description=f"Hugging Face model saved in {rest}", task=None, source="hf")
    if not _HF_MODEL_TYPE.fullmatch(rest):
        raise NameRefused(" (hf: takes a model_type such as gpt2, or an absolute directory)")
    return ModelInfo(name=name, description=f"Hugging Face {rest} from its config", task=None,
                     source="hf", options=tuple(HF_CONFIG_OPTIONS))


def configure(info: ModelInfo, options: dict[str, Any]) -> ModelInfo:
    check_model_options(info.name, options, {} if model_path(info.name) else HF_CONFIG_OPTIONS)
    return info


FAMILY = namespace_family(
    "hf", description=DESCRIPTION, options=HF_CONFIG_OPTIONS, patterns=("hf:<model_type>", "hf:<directory>"), find=find,
    configure=configure, builder="services.catalog.builders.own_models:build_hf",
)
