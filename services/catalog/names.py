"""Catalog of models and datasets by name: descriptions, options, sizes and compatibility,
torch-free.

The API process validates job specs against these entries and serves `GET /v1/catalog/...`
from them, and must never import torch, so this module (and everything it imports) is plain
Python. `services.catalog.build` turns the names into real objects; `tests/catalog/test_names.py`
checks the two agree, and that the torchvision list below equals
`torchvision.models.list_models(module=torchvision.models)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from services.catalog.text_corpus import TEXT_DEFAULT_MAX_LEN, corpus_stats

Task = Literal["classification", "language_modeling"]
Source = Literal["builtin", "torchvision", "timm", "hf", "plugin"]

# Torchvision image models never see less than this side: 8x8 digits through a ResNet stem
# collapse to 1x1 by the second stage, and several families (VGG, DenseNet, ConvNeXt) refuse
# anything below 32. Smaller images are upsampled (see build.InputAdapter).
DEFAULT_MIN_INPUT_SIZE = 32


@dataclass(frozen=True)
class ModelInfo:
    """One model the service can build by name.

    `min_input_size` and `input_multiple` describe what the image side is resized to for
    torchvision models: side = round_up(max(dataset side, min_input_size), input_multiple).
    `options` are the keyword options a spec may pass (`{"name": "mlp", "hidden": 256}`), the
    only ones (`timm:`, `hf:` and plugin models too: `served.declared_options` has their types).
    `task` None: the task follows from the dataset (`hf:` models, plugins).
    """

    name: str
    description: str
    task: Task | None
    source: Source
    min_input_size: int | None = None
    input_multiple: int = 1
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset the service can build by name (sizes are those of the default options).

    Your own data (`imagefolder`, `files`, `hf_disk`, plugins) has no size or class count
    before the worker reads it: those are None here and known in the built bundle's info.
    """

    name: str
    description: str
    task: Task
    num_classes: int | None
    train_size: int | None
    val_size: int | None
    channels: int | None = None
    image_size: int | None = None
    vocab_size: int | None = None
    max_seq_len: int | None = None
    needs_data_root: bool = False
    options: tuple[str, ...] = ()
    source: Literal["builtin", "own", "plugin"] = "builtin"
    features: int | None = None  # tabular rows: the number of feature columns
    pad_token_id: int | None = None  # text classification: the id its batches are padded with

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample: (C, H, W) for images, (max_seq_len,) for token sequences."""
        if self.channels is not None and self.image_size is not None:
            return (self.channels, self.image_size, self.image_size)
        if self.features is not None:
            return (self.features,)
        assert self.max_seq_len is not None
        return (self.max_seq_len,)

    @property
    def text_classification(self) -> bool:
        """Token sequences with one class label each (own data with text and label columns)."""
        return self.task == "classification" and self.max_seq_len is not None


# Registry name -> one-line description. Hard-coded so that listing them needs no torch.
TORCHVISION_MODELS: dict[str, str] = {
    "alexnet": "AlexNet (Krizhevsky et al. 2012): five convolutions and three dense layers.",
    "convnext_base": "ConvNeXt-Base (Liu et al. 2022): a ResNet modernised along Transformer lines.",
    "convnext_large": "ConvNeXt-Large (Liu et al. 2022): the largest ConvNeXt in torchvision.",
    "convnext_small": "ConvNeXt-Small (Liu et al. 2022): depthwise 7x7 convolutions, LayerNorm, GELU.",
    "convnext_tiny": "ConvNeXt-Tiny (Liu et al. 2022): the smallest ConvNeXt, ResNet-50 sized.",
    "densenet121": "DenseNet-121 (Huang et al. 2017): each layer sees all earlier feature maps.",
    "densenet161": "DenseNet-161 (Huang et al. 2017): wider growth rate (48) than the other DenseNets.",
    "densenet169": "DenseNet-169 (Huang et al. 2017): densely connected CNN, 169 layers.",
    "densenet201": "DenseNet-201 (Huang et al. 2017): densely connected CNN, 201 layers.",
    "efficientnet_b0": "EfficientNet-B0 (Tan & Le 2019): the NAS-found baseline of the compound-scaled family.",
    "efficientnet_b1": "EfficientNet-B1 (Tan & Le 2019): B0 scaled once in depth, width and resolution.",
    "efficientnet_b2": "EfficientNet-B2 (Tan & Le 2019): compound-scaled MBConv network.",
    "efficientnet_b3": "EfficientNet-B3 (Tan & Le 2019): compound-scaled MBConv network.",
    "efficientnet_b4": "EfficientNet-B4 (Tan & Le 2019): compound-scaled MBConv network.",
    "efficientnet_b5": "EfficientNet-B5 (Tan & Le 2019): compound-scaled MBConv network.",
    "efficientnet_b6": "EfficientNet-B6 (Tan & Le 2019): compound-scaled MBConv network.",
    "efficientnet_b7": "EfficientNet-B7 (Tan & Le 2019): the largest of the B family.",
    "efficientnet_v2_l": "EfficientNetV2-L (Tan & Le 2021): fused-MBConv stages, large variant.",
    "efficientnet_v2_m": "EfficientNetV2-M (Tan & Le 2021): fused-MBConv stages, medium variant.",
    "efficientnet_v2_s": "EfficientNetV2-S (Tan & Le 2021): fused-MBConv stages, small variant.",
    "googlenet": "GoogLeNet / Inception v1 (Szegedy et al. 2014), built without auxiliary heads.",
    "inception_v3": "Inception v3 (Szegedy et al. 2015), without the auxiliary head; inputs resized to >= 75.",
    "maxvit_t": "MaxViT-T (Tu et al. 2022): blocked and grid attention; inputs resized to a multiple of 224.",
    "mnasnet0_5": "MNASNet 0.5 (Tan et al. 2018): mobile NAS network at half width.",
    "mnasnet0_75": "MNASNet 0.75 (Tan et al. 2018): mobile NAS network at 0.75 width.",
    "mnasnet1_0": "MNASNet 1.0 (Tan et al. 2018): mobile NAS network at full width.",
    "mnasnet1_3": "MNASNet 1.3 (Tan et al. 2018): mobile NAS network at 1.3x width.",
    "mobilenet_v2": "MobileNetV2 (Sandler et al. 2018): inverted residuals with linear bottlenecks.",
    "mobilenet_v3_large": "MobileNetV3-Large (Howard et al. 2019): NAS-tuned, squeeze-excite, hard-swish.",
    "mobilenet_v3_small": "MobileNetV3-Small (Howard et al. 2019): the smallest MobileNetV3.",
    "regnet_x_16gf": "RegNetX-16GF (Radosavovic et al. 2020): regular design space, 16 GFLOPs at 224.",
    "regnet_x_1_6gf": "RegNetX-1.6GF (Radosavovic et al. 2020): regular design space, 1.6 GFLOPs at 224.",
    "regnet_x_32gf": "RegNetX-32GF (Radosavovic et al. 2020): regular design space, 32 GFLOPs at 224.",
    "regnet_x_3_2gf": "RegNetX-3.2GF (Radosavovic et al. 2020): regular design space, 3.2 GFLOPs at 224.",
    "regnet_x_400mf": "RegNetX-400MF (Radosavovic et al. 2020): regular design space, 0.4 GFLOPs at 224.",
    "regnet_x_800mf": "RegNetX-800MF (Radosavovic et al. 2020): regular design space, 0.8 GFLOPs at 224.",
    "regnet_x_8gf": "RegNetX-8GF (Radosavovic et al. 2020): regular design space, 8 GFLOPs at 224.",
    "regnet_y_128gf": "RegNetY-128GF (Radosavovic et al. 2020): squeeze-excite RegNet, the largest in torchvision.",
    "regnet_y_16gf": "RegNetY-16GF (Radosavovic et al. 2020): squeeze-excite RegNet, 16 GFLOPs at 224.",
    "regnet_y_1_6gf": "RegNetY-1.6GF (Radosavovic et al. 2020): squeeze-excite RegNet, 1.6 GFLOPs at 224.",
    "regnet_y_32gf": "RegNetY-32GF (Radosavovic et al. 2020): squeeze-excite RegNet, 32 GFLOPs at 224.",
    "regnet_y_3_2gf": "RegNetY-3.2GF (Radosavovic et al. 2020): squeeze-excite RegNet, 3.2 GFLOPs at 224.",
    "regnet_y_400mf": "RegNetY-400MF (Radosavovic et al. 2020): squeeze-excite RegNet, 0.4 GFLOPs at 224.",
    "regnet_y_800mf": "RegNetY-800MF (Radosavovic et al. 2020): squeeze-excite RegNet, 0.8 GFLOPs at 224.",
    "regnet_y_8gf": "RegNetY-8GF (Radosavovic et al. 2020): squeeze-excite RegNet, 8 GFLOPs at 224.",
    "resnet101": "ResNet-101 (He et al. 2015): bottleneck residual network, 101 layers.",
    "resnet152": "ResNet-152 (He et al. 2015): bottleneck residual network, 152 layers.",
    "resnet18": "ResNet-18 (He et al. 2015): basic-block residual network, 18 layers.",
    "resnet34": "ResNet-34 (He et al. 2015): basic-block residual network, 34 layers.",
    "resnet50": "ResNet-50 (He et al. 2015): bottleneck residual network, 50 layers.",
    "resnext101_32x8d": "ResNeXt-101 32x8d (Xie et al. 2017): grouped-convolution ResNet, 32 groups of width 8.",
    "resnext101_64x4d": "ResNeXt-101 64x4d (Xie et al. 2017): grouped-convolution ResNet, 64 groups of width 4.",
    "resnext50_32x4d": "ResNeXt-50 32x4d (Xie et al. 2017): grouped-convolution ResNet, 32 groups of width 4.",
    "shufflenet_v2_x0_5": "ShuffleNetV2 x0.5 (Ma et al. 2018): channel-shuffle mobile network at half width.",
    "shufflenet_v2_x1_0": "ShuffleNetV2 x1.0 (Ma et al. 2018): channel-shuffle mobile network.",
    "shufflenet_v2_x1_5": "ShuffleNetV2 x1.5 (Ma et al. 2018): channel-shuffle mobile network at 1.5x width.",
    "shufflenet_v2_x2_0": "ShuffleNetV2 x2.0 (Ma et al. 2018): channel-shuffle mobile network at 2x width.",
    "squeezenet1_0": "SqueezeNet 1.0 (Iandola et al. 2016): fire modules, AlexNet accuracy with few parameters.",
    "squeezenet1_1": "SqueezeNet 1.1: SqueezeNet with 2.4x less computation than 1.0.",
    "swin_b": "Swin-B (Liu et al. 2021): shifted-window vision Transformer, base size.",
    "swin_s": "Swin-S (Liu et al. 2021): shifted-window vision Transformer, small size.",
    "swin_t": "Swin-T (Liu et al. 2021): shifted-window vision Transformer, tiny size.",
    "swin_v2_b": "Swin V2-B (Liu et al. 2022): Swin with scaled cosine attention, base size.",
    "swin_v2_s": "Swin V2-S (Liu et al. 2022): Swin with scaled cosine attention, small size.",
    "swin_v2_t": "Swin V2-T (Liu et al. 2022): Swin with scaled cosine attention, tiny size.",
    "vgg11": "VGG-11 (Simonyan & Zisserman 2014): plain 3x3 convolution stack, 11 layers.",
    "vgg11_bn": "VGG-11 with BatchNorm after every convolution.",
    "vgg13": "VGG-13 (Simonyan & Zisserman 2014): plain 3x3 convolution stack, 13 layers.",
    "vgg13_bn": "VGG-13 with BatchNorm after every convolution.",
    "vgg16": "VGG-16 (Simonyan & Zisserman 2014): plain 3x3 convolution stack, 16 layers.",
    "vgg16_bn": "VGG-16 with BatchNorm after every convolution.",
    "vgg19": "VGG-19 (Simonyan & Zisserman 2014): plain 3x3 convolution stack, 19 layers.",
    "vgg19_bn": "VGG-19 with BatchNorm after every convolution.",
    "vit_b_16": "ViT-B/16 (Dosovitskiy et al. 2020): vision Transformer, base, 16x16 patches.",
    "vit_b_32": "ViT-B/32 (Dosovitskiy et al. 2020): vision Transformer, base, 32x32 patches.",
    "vit_h_14": "ViT-H/14 (Dosovitskiy et al. 2020): vision Transformer, huge, 14x14 patches.",
    "vit_l_16": "ViT-L/16 (Dosovitskiy et al. 2020): vision Transformer, large, 16x16 patches.",
    "vit_l_32": "ViT-L/32 (Dosovitskiy et al. 2020): vision Transformer, large, 32x32 patches.",
    "wide_resnet101_2": "Wide ResNet-101-2 (Zagoruyko & Komodakis 2016): ResNet-101 with 2x wider bottlenecks.",
    "wide_resnet50_2": "Wide ResNet-50-2 (Zagoruyko & Komodakis 2016): ResNet-50 with 2x wider bottlenecks.",
}

# Architectures that refuse inputs below DEFAULT_MIN_INPUT_SIZE's floor, or need a grid.
# Values come from torchvision's weight metadata (`min_size`) or the architecture itself.
_MIN_INPUT_SIZE = {"alexnet": 63, "inception_v3": 75, "maxvit_t": 224}
# ViTs are built for one image size that must divide into patches; MaxViT's partitions of 7
# must tile every stage (4 halvings after a stride-2 stem: 7 * 32 = 224).
_INPUT_MULTIPLE = {
    "vit_b_16": 16,
    "vit_b_32": 32,
    "vit_h_14": 14,
    "vit_l_16": 16,
    "vit_l_32": 32,
    "maxvit_t": 224,
}

BUILTIN_MODELS: dict[str, ModelInfo] = {
    "mlp": ModelInfo(
        name="mlp",
        description="Multilayer perceptron on flattened pixels (ReLU hidden layers); fast on CPU.",
        task="classification",
        source="builtin",
        options=("hidden", "depth"),
    ),
    "small_cnn": ModelInfo(
        name="small_cnn",
        description="Three 3x3 convolutions and a linear head, no BatchNorm or dropout; fast on CPU.",
        task="classification",
        source="builtin",
        options=("width",),
    ),
    "tiny_transformer": ModelInfo(
        name="tiny_transformer",
        description="Tiny causal Transformer language model (2 layers, d=64) for token tasks.",
        task="language_modeling",
        source="builtin",
        options=("d_model", "n_layers", "n_heads"),
    ),
}

# Every model option is a size or a count, inclusive (minimum, maximum); an MLP may have no
# hidden layer (a linear model). The maxima keep one option from asking for more than any
# device holds (mlp hidden 65536 x depth 64 is already 275 billion parameters: the memory
# estimate, services.catalog.sizes, refuses what is still too large). `configured_model`
# checks these, at submit and again before a build.
MODEL_OPTION_RANGE: dict[str, tuple[int, int]] = {
    "hidden": (1, 65536),
    "depth": (0, 64),
    "width": (1, 4096),
    "d_model": (1, 8192),
    "n_layers": (1, 128),
    "n_heads": (1, 256),
}
# Dataset options: sizes in samples, image side in pixels, sequence length in tokens.
DATASET_OPTION_RANGE: dict[str, tuple[int, int]] = {
    "size": (1, 10_000_000),
    "val_size": (1, 1_000_000),
    "image_size": (1, 1024),
    "num_classes": (2, 100_000),
    "max_len": (2, 4096),
}


def option_value(kind: str, name: str, key: str, value: Any) -> int:
    """`value` when it is an integer inside the option's range, else ValueError naming both."""
    low, high = (MODEL_OPTION_RANGE if kind == "model" else DATASET_OPTION_RANGE)[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{kind} {name!r} option {key} must be an integer from {low} to {high}; got {value!r}"
        )
    return value

MODELS: dict[str, ModelInfo] = {
    **BUILTIN_MODELS,
    **{
        name: ModelInfo(
            name=name,
            description=description,
            task="classification",
            source="torchvision",
            min_input_size=max(_MIN_INPUT_SIZE.get(name, 0), DEFAULT_MIN_INPUT_SIZE),
            input_multiple=_INPUT_MULTIPLE.get(name, 1),
        )
        for name, description in TORCHVISION_MODELS.items()
    },
}

# The 8x8 digits shipped as package data (scikit-learn's copy, services/catalog/data): 1797
# images; a fixed 20% (rounded up) goes to validation.
DIGITS_TOTAL = 1797
DIGITS_VAL_SIZE = 360

_text_stats = corpus_stats(TEXT_DEFAULT_MAX_LEN)

DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        name="digits",
        description="8x8 handwritten digits shipped with accum (scikit-learn's copy; real data, offline), fixed split.",
        task="classification",
        num_classes=10,
        train_size=DIGITS_TOTAL - DIGITS_VAL_SIZE,
        val_size=DIGITS_VAL_SIZE,
        channels=1,
        image_size=8,
    ),
    "fake": DatasetInfo(
        name="fake",
        description="torchvision FakeData: deterministic random 3x32x32 images and labels.",
        task="classification",
        num_classes=10,
        train_size=1024,
        val_size=256,
        channels=3,
        image_size=32,
        options=("size", "val_size", "image_size", "num_classes"),
    ),
    "mnist": DatasetInfo(
        name="mnist",
        description="MNIST handwritten digits, 28x28 grayscale (torchvision, from the data root).",
        task="classification",
        num_classes=10,
        train_size=60000,
        val_size=10000,
        channels=1,
        image_size=28,
        needs_data_root=True,
    ),
    "fashion_mnist": DatasetInfo(
        name="fashion_mnist",
        description="Fashion-MNIST clothing images, 28x28 grayscale (torchvision, from the data root).",
        task="classification",
        num_classes=10,
        train_size=60000,
        val_size=10000,
        channels=1,
        image_size=28,
        needs_data_root=True,
    ),
    "cifar10": DatasetInfo(
        name="cifar10",
        description="CIFAR-10 colour images, 32x32, 10 classes (torchvision, from the data root).",
        task="classification",
        num_classes=10,
        train_size=50000,
        val_size=10000,
        channels=3,
        image_size=32,
        needs_data_root=True,
    ),
    "text": DatasetInfo(
        name="text",
        description=(
            "Alice in Wonderland ch. I-III (public domain): one token per character, "
            "sentences of varying length, padding targets -100."
        ),
        task="language_modeling",
        num_classes=_text_stats.vocab_size,
        train_size=_text_stats.train_size,
        val_size=_text_stats.val_size,
        vocab_size=_text_stats.vocab_size,
        max_seq_len=TEXT_DEFAULT_MAX_LEN,
        options=("max_len",),
    ),
}


def torchvision_input_side(info: ModelInfo, image_size: int) -> int:
    """The square side a torchvision model is fed for images of side `image_size`."""
    side = max(image_size, info.min_input_size or 1)
    return math.ceil(side / info.input_multiple) * info.input_multiple


def _unknown(kind: str, name: object, allowed: Iterable[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; allowed {kind}s: {', '.join(sorted(allowed))}")


def require_model(name: str) -> ModelInfo:
    """The catalog entry of a model, or ValueError listing the allowed names."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise _unknown("model", name, MODELS) from None


def require_dataset(name: str) -> DatasetInfo:
    """The catalog entry of a dataset, or ValueError listing the allowed names."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise _unknown("dataset", name, DATASETS) from None


def check_compatible(model: str, dataset: str) -> str | None:
    """None when `model` can train on `dataset`, else a reason that says what would work.

    Raises ValueError for names not in the catalog.
    """
    model_info, dataset_info = require_model(model), require_dataset(dataset)
    if model_info.task == dataset_info.task:
        return None
    assert model_info.task is not None  # every catalog model has its task
    return (
        f"model {model!r} is for {model_info.task.replace('_', ' ')} but dataset {dataset!r} is a "
        f"{dataset_info.task.replace('_', ' ')} dataset; datasets for {model!r}: "
        f"{', '.join(compatible_datasets(model))}; models for {dataset!r}: "
        f"{_summarise_models(compatible_models(dataset))}"
    )


def compatible_datasets(model: str) -> list[str]:
    """Names of the datasets `model` can train on, sorted."""
    task = require_model(model).task
    return sorted(name for name, info in DATASETS.items() if info.task == task)


def compatible_models(dataset: str) -> list[str]:
    """Names of the models that can train on `dataset`, built-ins first, then sorted."""
    task = require_dataset(dataset).task
    return [name for name, info in MODELS.items() if info.task == task]


def _summarise_models(names: list[str]) -> str:
    builtins = [n for n in names if MODELS[n].source == "builtin"]
    others = len(names) - len(builtins)
    return ", ".join(builtins) + (f" or any of {others} torchvision models" if others else "")


def check_options(kind: str, name: str, options: Mapping[str, Any]) -> str | None:
    """None when every key of `options` is accepted by model/dataset `name`, else a reason."""
    info: ModelInfo | DatasetInfo
    if kind == "model":
        info = require_model(name)
    elif kind == "dataset":
        info = require_dataset(name)
    else:
        raise ValueError(f"kind must be 'model' or 'dataset', got {kind!r}")
    unknown = sorted(set(options) - set(info.options))
    if not unknown:
        return None
    accepted = ", ".join(info.options) if info.options else "none"
    return f"{kind} {name!r} does not accept option(s) {', '.join(unknown)}; accepted options: {accepted}"


def configured_model(name: str, options: Mapping[str, Any] | None = None) -> ModelInfo:
    """The catalog entry of model `name` once `options` are checked: declared, and in range.

    The checks `build.build_model(name, dataset, **options)` makes before building, without
    torch, so the API refuses at submit what a worker would refuse at start.
    Raises ValueError for unknown names, unknown options and out-of-range values.
    """
    info = require_model(name)
    options = dict(options or {})
    if reason := check_options("model", name, options):
        raise ValueError(reason)
    for key, value in options.items():
        option_value("model", name, key, value)
    return info


def configured_dataset(name: str, options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """The catalog entry of dataset `name` with `options` applied (sizes, shapes, classes).

    This is what `build.build_dataset(name, **options)` returns as `bundle.info`, computed
    without torch, so the API can size epochs for e.g. `{"name": "fake", "size": 256}`.
    Raises ValueError for unknown names, unknown options and out-of-range values.
    """
    info = require_dataset(name)
    options = dict(options or {})
    if reason := check_options("dataset", name, options):
        raise ValueError(reason)

    def option(key: str, default: int) -> int:
        return option_value("dataset", name, key, options.get(key, default))

    if name == "fake":
        assert info.image_size is not None and info.num_classes is not None
        assert info.train_size is not None and info.val_size is not None
        return replace(
            info,
            train_size=option("size", info.train_size),
            val_size=option("val_size", info.val_size),
            image_size=option("image_size", info.image_size),
            num_classes=option("num_classes", info.num_classes),
        )
    if name == "text":
        assert info.max_seq_len is not None
        max_len = option("max_len", info.max_seq_len)
        stats = corpus_stats(max_len)
        return replace(
            info, train_size=stats.train_size, val_size=stats.val_size, max_seq_len=max_len
        )
    return info


def models_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/models` items, in catalog order."""
    return [
        {
            "name": info.name,
            "description": info.description,
            "task": info.task,
            "source": info.source,
            "options": list(info.options),
            "min_input_size": info.min_input_size,
            "compatible_datasets": compatible_datasets(info.name),
        }
        for info in MODELS.values()
    ]


def dataset_item(info: DatasetInfo, compatible: list[str]) -> dict[str, Any]:
    """One JSON-ready `GET /v1/catalog/datasets` item."""
    return {
        "name": info.name,
        "description": info.description,
        "task": info.task,
        "source": info.source,
        "num_classes": info.num_classes,
        "train_size": info.train_size,
        "val_size": info.val_size,
        "channels": info.channels,
        "image_size": info.image_size,
        "vocab_size": info.vocab_size,
        "max_seq_len": info.max_seq_len,
        "needs_data_root": info.needs_data_root,
        "options": list(info.options),
        "compatible_models": compatible,
    }


def datasets_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/datasets` items, in catalog order."""
    return [dataset_item(info, compatible_models(info.name)) for info in DATASETS.values()]
