"""Torchvision's image classifiers, randomly initialised, by their registry names (torch-free).

The names and descriptions are written here so that listing them needs no torch;
`tests/catalog/test_builtin_families.py` checks the list equals
`torchvision.models.list_models(module=torchvision.models)`. Inputs are adapted to each model
(`models.InputAdapter`: grayscale repeated to 3 channels, small images upsampled to the side
below). Memory comes from `model_sizes.py`, measured with torch by
`python -m services.catalog.measure --write` at REFERENCE_CLASSES classes on a 32x32 image,
and scaled with the class count and the side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from services.catalog.entries import Compatible, DatasetInfo, ModelFamily, ModelInfo
from services.catalog.model_sizes import TORCHVISION_SIZES
from services.catalog.option_types import undeclared

# Torchvision image models never see less than this side: 8x8 digits through a ResNet stem
# collapse to 1x1 by the second stage, and several families (VGG, DenseNet, ConvNeXt) refuse
# anything below 32. Smaller images are upsampled (see models.InputAdapter).
DEFAULT_MIN_INPUT_SIZE = 32
REFERENCE_CLASSES = 10
REFERENCE_IMAGE_SIZE = 32

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

TORCHVISION_ENTRIES: dict[str, ModelInfo] = {
    name: ModelInfo(
        name=name,
        description=description,
        task="classification",
        source="torchvision",
        min_input_size=max(_MIN_INPUT_SIZE.get(name, 0), DEFAULT_MIN_INPUT_SIZE),
        input_multiple=_INPUT_MULTIPLE.get(name, 1),
    )
    for name, description in TORCHVISION_MODELS.items()
}


def torchvision_input_side(info: ModelInfo, image_size: int) -> int:
    """The square side a torchvision model is fed for images of side `image_size`."""
    side = max(image_size, info.min_input_size or 1)
    return math.ceil(side / info.input_multiple) * info.input_multiple


def configure(info: ModelInfo, options: dict[str, Any]) -> ModelInfo:
    """Torchvision models take no options (the dataset sizes them)."""
    if reason := undeclared("model", info.name, options, info.options):
        raise ValueError(reason)
    return info


def size(info: ModelInfo, options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    """(parameters, activation elements per sample) for `data`'s classes and image side."""
    params, per_class, acts = TORCHVISION_SIZES[info.name]
    assert data.num_classes is not None and data.image_size is not None  # sized_by_catalog
    params += (data.num_classes - REFERENCE_CLASSES) * per_class
    reference = torchvision_input_side(info, REFERENCE_IMAGE_SIZE)
    side = torchvision_input_side(info, data.image_size)
    # Convolutions scale with the pixels (attention faster still: a floor either way).
    return params, acts * side * side // (reference * reference)


def listing(compatible: Compatible) -> list[dict[str, Any]]:
    return [info.listing_item(compatible(info.name)) for info in TORCHVISION_ENTRIES.values()]


FAMILY = ModelFamily(
    source="torchvision", naming="catalog", names=TORCHVISION_ENTRIES.keys,
    find=TORCHVISION_ENTRIES.get, configure=configure, listing=listing, size=size,
    builder="services.catalog.builders.models:build_torchvision",
)
