"""Every compatible catalog model x dataset pair runs a forward+backward step.

Pairs are grouped by the input the network sees, to stay within the test budget on two
shared CPU cores (the torchvision part costs about 40 s of CPU to build all 80 models and
35 s to step them; a step per dataset shape would triple the second figure):
- datasets by input shape (digits 1x8x8; mnist and fashion_mnist 1x28x28; cifar10 and fake
  3x32x32); data-root datasets use random tensors of their shape here (and real files from
  a tiny data root in test_datasets.py);
- a torchvision model's build depends only on (num_classes, fed side), and its input adapter
  turns every group into the same (B, 3, side, side) batch: each group is checked through the
  adapter, and the whole model steps once on the group needing the most adapting (grayscale,
  smallest). Built-in models step on every dataset.
Batch size 2, the smallest BatchNorm accepts in train mode.
"""

from __future__ import annotations

import gc
import math
from collections import defaultdict

import pytest
import torch

from services.catalog import DATASETS, MODELS, compatible_datasets
from services.catalog.build import build_dataset, build_loss, build_model
from services.catalog.builders.models import AdaptedImageModel, torchvision_input_side

BATCH = 2


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def image_groups(model: str) -> dict[tuple[int, ...], list[str]]:
    """Compatible catalog image datasets of `model`, grouped by input shape (your own data,
    sized only when read, has its tests in test_own_data.py and test_own_models.py)."""
    groups: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for name in compatible_datasets(model):
        if name in DATASETS:
            groups[DATASETS[name].input_shape].append(name)
    return dict(groups)


def synthetic_batch(shape: tuple[int, ...], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn((BATCH, *shape), generator=generator)
    return inputs, torch.randint(0, num_classes, (BATCH,), generator=generator)


def assert_all_grads_finite(model: torch.nn.Module) -> None:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in params if p.grad is None]
    assert not missing, f"parameters without gradient: {missing[:5]}"
    bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad[:5]}"
    assert any(p.grad.abs().sum() > 0 for _, p in params)


def run_groups(model: torch.nn.Module, groups: dict[tuple[int, ...], list[str]]) -> None:
    """Forward one batch per input-shape group, then one backward through all of them."""
    model.train()
    total = torch.zeros(())
    for shape, names in groups.items():
        num_classes = DATASETS[names[0]].num_classes
        inputs, targets = synthetic_batch(shape, num_classes)
        logits = model(inputs)
        assert logits.shape == (BATCH, num_classes), (names, tuple(logits.shape))
        loss = build_loss(names[0])(logits, targets)
        assert math.isfinite(loss.item()), names
        total = total + loss
    total.backward()
    assert_all_grads_finite(model)


def build_key(model: str, dataset: str) -> tuple[int, int]:
    info = DATASETS[dataset]
    assert info.image_size is not None
    return info.num_classes, torchvision_input_side(MODELS[model], info.image_size)


TORCHVISION = sorted(n for n, info in MODELS.items() if info.source == "torchvision")
# The smallest member of each torchvision family (the same blocks and adapter at other widths
# and depths): `make test-fast` steps these; `make test` steps every model (the `sweep` cases),
# which is most of this file's cost (regnet_y_128gf alone builds 637 M parameters).
FAMILY_REPRESENTATIVES = frozenset({
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
    "googlenet", "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small",
    "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnext50_32x4d", "shufflenet_v2_x0_5",
    "squeezenet1_0", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11", "vgg11_bn", "vit_b_32",
    "wide_resnet50_2",
})


def test_every_family_has_a_representative_in_the_catalog() -> None:
    assert set(TORCHVISION) >= FAMILY_REPRESENTATIVES


@pytest.mark.parametrize(
    "name",
    [n if n in FAMILY_REPRESENTATIVES else pytest.param(n, marks=pytest.mark.sweep) for n in TORCHVISION],
)
def test_torchvision_model_steps_on_every_image_dataset(name: str) -> None:
    torch.manual_seed(0)
    by_key: dict[tuple[int, int], dict[tuple[int, ...], list[str]]] = defaultdict(dict)
    for shape, names in image_groups(name).items():
        by_key[build_key(name, names[0])][shape] = names
    for (_, side), groups in by_key.items():
        any_dataset = next(iter(groups.values()))[0]
        model = build_model(name, DATASETS[any_dataset])
        assert isinstance(model, AdaptedImageModel)
        # Every group's images reach the network as the same (B, 3, side, side) batch...
        for shape in groups:
            adapted = model.adapter(
                synthetic_batch(shape, DATASETS[groups[shape][0]].num_classes)[0]
            )
            assert adapted.shape == (BATCH, 3, side, side), (name, shape)
        # ...so the whole model steps once, on the group that needs the most adapting.
        shape = min(groups, key=lambda s: (s[0], s[-1]))
        run_groups(model, {shape: groups[shape]})
        del model
        gc.collect()


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_builtin_image_model_steps_on_every_image_dataset(name: str) -> None:
    torch.manual_seed(0)
    for shape, names in image_groups(name).items():
        for dataset in names:  # cheap models: one build per dataset, no sharing needed
            run_groups(build_model(name, DATASETS[dataset]), {shape: [dataset]})


def test_tiny_transformer_steps_on_padded_text_batches() -> None:
    torch.manual_seed(0)
    bundle = build_dataset("text")
    model = build_model("tiny_transformer", bundle)
    assert bundle.collate_fn is not None
    inputs, targets = bundle.collate_fn([bundle.train[i] for i in range(4)])
    logits = model(inputs)
    assert logits.shape == (*inputs.shape, bundle.info.vocab_size)
    build_loss(bundle)(logits, targets).backward()
    assert_all_grads_finite(model)


def test_one_build_serves_every_dataset_with_the_same_key() -> None:
    """Backs the grouping above: builds for digits and cifar10 have identical parameters."""
    for name in ("resnet18", "vit_b_16", "squeezenet1_1"):
        assert build_key(name, "digits") == build_key(name, "cifar10")
        shapes = [
            {k: v.shape for k, v in build_model(name, d).state_dict().items()}
            for d in ("digits", "cifar10")
        ]
        assert shapes[0] == shapes[1]


def test_inputs_are_upsampled_to_the_models_minimum_and_repeated_to_three_channels() -> None:
    model = build_model("inception_v3", "digits")
    assert isinstance(model, AdaptedImageModel)
    seen: list[torch.Size] = []
    model.net.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape))
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, 1, 8, 8))
    assert seen == [torch.Size([1, 3, 75, 75])]
    assert torchvision_input_side(MODELS["vit_h_14"], 32) == 42  # multiple of the 14 patch
    assert torchvision_input_side(MODELS["maxvit_t"], 32) == 224
    assert torchvision_input_side(MODELS["resnet18"], 64) == 64  # larger images pass as is


def test_torchvision_models_are_randomly_initialised() -> None:
    torch.manual_seed(0)
    first = build_model("resnet18", "cifar10").state_dict()["net.conv1.weight"]
    torch.manual_seed(1)
    second = build_model("resnet18", "cifar10").state_dict()["net.conv1.weight"]
    assert not torch.equal(first, second)


def test_bad_model_requests_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet9000'.*small_cnn"):
        build_model("resnet9000", "digits")
    with pytest.raises(ValueError, match="datasets for 'tiny_transformer': text"):
        build_model("tiny_transformer", "digits")
    with pytest.raises(ValueError, match="accepted options: hidden, depth"):
        build_model("mlp", "digits", width=3)
    with pytest.raises(ValueError, match="accepted options: none"):
        build_model("resnet18", "digits", weights="IMAGENET1K_V1")
    # The ranges the spec refuses at submit (the catalog's configured_model), refused here too.
    with pytest.raises(ValueError, match="model 'mlp' option hidden must be an integer from 1 to 65536"):
        build_model("mlp", "digits", hidden=2.5)


def test_builtin_options_change_the_model() -> None:
    small = build_model("mlp", "digits", hidden=8)
    deep = build_model("mlp", "digits", hidden=8, depth=3)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(deep) > count(small)
    assert count(build_model("small_cnn", "digits", width=4)) < count(
        build_model("small_cnn", "digits")
    )
