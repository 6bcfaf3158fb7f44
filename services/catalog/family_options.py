"""What options the `timm:` and `hf:` model families accept, with types and bounds (torch-free).

An allow-list: the audit of 2026-11 (issue 25) found free `timm:` options passed to
`timm.create_model`, so `checkpoint_path` loaded any file the worker could read (another
owner's cached checkpoint, `/etc/passwd` quoted in the job's error). A key not listed here is
refused at submit (422 at `model.<key>`, the accepted options listed) and again on the worker,
which parses the stored spec through the same checks. `hf:<directory>` takes no options:
nothing reaches `from_pretrained` from the spec. Plugins declare their own
(`plugins.declared_options`). Weights of another job come only through `init_from`, which
checks the owner.
"""

from __future__ import annotations

from services.catalog.option_types import Option

MAX_IMAGE_SIDE = 4096
MAX_SIZE = 1 << 20  # a width, depth, head count or vocabulary far beyond one device's memory
FRACTION = Option("number", 0, 1)
SIZE = Option("integer", 1, MAX_SIZE)
TOKEN_ID = Option("integer", 0, MAX_SIZE)
EPSILON = Option("number", 0, 1)

TIMM_OPTIONS: dict[str, Option] = {
    "pretrained": Option("boolean"),
    "weights": Option("data_file"),  # checked against the data roots: JobSpec.local_paths
    "drop_rate": FRACTION,
    "drop_path_rate": FRACTION,
    "global_pool": Option("choice", choices=("avg", "max", "avgmax", "catavgmax", "token")),
    "img_size": Option("integer", 1, MAX_IMAGE_SIDE),
}

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
