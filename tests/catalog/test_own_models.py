"""timm:, hf: and plugin models: built for the dataset, options checked, refusals that say what
was tried and what would work, pretrained weights from a file and never from the network."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from services.catalog import configured_dataset, require_dataset
from services.catalog.build import build_loss, build_model, takes_keywords
from services.catalog.builders.own_models import CausalLMLoss

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

IMAGES = replace(require_dataset("imagefolder"), num_classes=3, image_size=32)
TEXT = replace(configured_dataset("files", {"data_files": "a.jsonl", "tokenizer": "bytes", "max_len": 32}),
               vocab_size=256, num_classes=256)
TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64}


def test_timm_model_is_sized_for_the_dataset() -> None:
    model = build_model("timm:resnet18", IMAGES)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    assert not takes_keywords(model)
    assert isinstance(build_loss(IMAGES, model), torch.nn.CrossEntropyLoss)


def test_unknown_timm_name_lists_close_names() -> None:
    with pytest.raises(ValueError, match=r"timm has no model 'resnet181'.*close names: .*resnet18"):
        build_model("timm:resnet181", IMAGES)


def test_timm_options_pass_to_create_model_and_bad_ones_fail_clearly() -> None:
    model = build_model("timm:resnet18", IMAGES, drop_rate=0.25)
    assert model.drop_rate == 0.25
    with pytest.raises(ValueError, match="refused options"):  # allowed, but not by this model
        build_model("timm:resnet18", IMAGES, img_size=64)


@pytest.mark.parametrize("option", ["checkpoint_path", "pretrained_cfg_overlay", "no_such_argument"])
def test_timm_options_outside_the_allow_list_never_reach_timm(option: str, tmp_path: Path) -> None:
    """timm's `checkpoint_path` loaded any file the worker could read (issue 25, item 1)."""
    stolen = tmp_path / "other_owner.pt"
    torch.save(build_model("timm:resnet18", IMAGES).state_dict(), stolen)
    with pytest.raises(ValueError, match=f"does not accept option '{option}'.*; accepted options: true or false: pretrained"):
        build_model("timm:resnet18", IMAGES, **{option: str(stolen)})


def test_pretrained_without_weights_says_what_was_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError) as info:
        build_model("timm:resnet18", IMAGES, pretrained=True)
    message = str(info.value)
    assert "not on this node (tried timm/resnet18" in message and "never downloaded" in message
    assert '"weights"' in message


def test_pretrained_from_a_weights_file_keeps_the_body_and_reinitialises_the_head(tmp_path: Path) -> None:
    import timm

    torch.manual_seed(1)
    source = timm.create_model("resnet18", num_classes=10)
    path = tmp_path / "resnet18.pt"
    torch.save(source.state_dict(), path)
    model = build_model("timm:resnet18", IMAGES, pretrained=True, weights=str(path))
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert model.fc.weight.shape == (3, 512)  # the 10-class head is dropped, a new one made
    with pytest.raises(ValueError, match="no file at weights="):
        build_model("timm:resnet18", IMAGES, pretrained=True, weights=str(tmp_path / "missing.pt"))


def test_hf_model_from_its_config_with_overrides() -> None:
    model = build_model("hf:gpt2", TEXT, **TINY_GPT2)
    assert model.config.n_layer == 2 and model.config.vocab_size == 256
    assert takes_keywords(model) and isinstance(build_loss(TEXT, model), CausalLMLoss)
    out = model(input_ids=torch.randint(0, 256, (2, 8)))
    assert out.logits.shape == (2, 8, 256)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("hf:gpt3", {}, r"no model_type 'gpt3'; close: .*gpt2"),
    ("hf:gpt2", {"n_layers": 2}, r"does not accept option 'n_layers' \(did you mean n_layer or .*; accepted options: .*n_layer"),
    ("hf:gpt2", {"n_layer": "two"}, r"option n_layer must be integer 1\.\.1048576; got 'two'"),
    ("hf:gpt2", {**TINY_GPT2, "n_positions": 16}, "n_positions 16 is below the dataset's max_len 32"),
    ("hf:gpt2", {**TINY_GPT2, "vocab_size": 100}, "vocab_size 100 is smaller than the tokenizer's 256"),
])
def test_hf_refusals_name_the_allowed_values(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(name, TEXT, **options)


def test_an_unknown_hf_type_names_the_close_ones_not_every_one() -> None:
    with pytest.raises(ValueError) as raised:
        build_model("hf:gpt3", TEXT)
    message = str(raised.value)
    assert "gpt2" in message and "bert" not in message.split("close: ")[1]
    assert len(message) < 300 and "model types, listed by python -c" in message


def test_hf_saved_directory_loads_the_same_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = build_model("hf:gpt2", TEXT, **TINY_GPT2)
    saved.save_pretrained(tmp_path / "tiny")
    loaded = build_model(f"hf:{tmp_path / 'tiny'}", TEXT)
    for (name, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="config.json missing"):
        build_model(f"hf:{tmp_path}", TEXT)


def test_hf_image_classifier_returns_logits() -> None:
    model = build_model("hf:vit", IMAGES, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, patch_size=8)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


LABELLED = replace(configured_dataset("files", {"data_files": "a.jsonl", "tokenizer": "bytes", "max_len": 32,
                                               "columns": {"text": "body", "label": "y"}}),
                   num_classes=3, vocab_size=257, pad_token_id=256)
TINY_BERT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}


@pytest.mark.parametrize(("name", "options"), [("hf:bert", TINY_BERT), ("hf:gpt2", TINY_GPT2)])
def test_hf_sequence_classifier_for_text_with_labels(name: str, options: dict) -> None:
    model = build_model(name, LABELLED, **options)
    inner = model.inner
    assert type(inner).__name__.endswith("ForSequenceClassification") and not takes_keywords(model)
    assert (inner.config.num_labels, inner.config.vocab_size, inner.config.pad_token_id) == (3, 257, 256)
    ids = torch.tensor([[97, 98, 256, 256], [97, 98, 99, 100]])
    model.eval()  # no dropout: the same rows give the same logits
    logits = model(input_ids=ids, attention_mask=(ids != 256).long())
    assert logits.shape == (2, 3)
    alone = model(input_ids=ids[:1, :2], attention_mask=torch.ones(1, 2, dtype=torch.long))
    torch.testing.assert_close(logits[:1], alone)  # padding changes nothing: the mask and the pad id
    assert isinstance(build_loss(LABELLED, model), torch.nn.CrossEntropyLoss)
    with pytest.raises(ValueError, match="pad_token_id must be the data's padding id 256"):
        build_model(name, LABELLED, **options, pad_token_id=0)
    with pytest.raises(ValueError, match=r"vocab_size 100 is smaller than the tokenizer's 257 \(with its padding id\)"):
        build_model(name, LABELLED, **options, vocab_size=100)


def test_hf_saved_classifier_gets_the_datas_classes_and_padding(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = build_model("hf:bert", replace(LABELLED, num_classes=5), **TINY_BERT)
    saved.inner.save_pretrained(tmp_path / "bert")
    loaded = build_model(f"hf:{tmp_path / 'bert'}", LABELLED)
    assert loaded.inner.config.num_labels == 3 and loaded.inner.config.pad_token_id == 256
    assert torch.equal(loaded.inner.bert.embeddings.word_embeddings.weight,
                       saved.inner.bert.embeddings.word_embeddings.weight)
    with pytest.raises(ValueError, match="embeds 257 token ids but the data's tokenizer uses 300"):
        build_model(f"hf:{tmp_path / 'bert'}", replace(LABELLED, vocab_size=300))


def test_catalog_models_are_refused_for_text_classification() -> None:
    with pytest.raises(ValueError, match="is sequence classification, which model 'mlp' cannot read"):
        build_model("mlp", LABELLED)


def test_causal_lm_loss_scores_shifted_labels_in_the_model_dtype() -> None:
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 0, 1]])
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1))
    loss = CausalLMLoss()(logits, labels)
    assert loss.dtype == torch.float64 and torch.equal(loss, expected)
