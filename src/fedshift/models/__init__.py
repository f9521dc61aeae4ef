"""Models: every network is a :class:`SplitModel` with a feature ``body`` and a classifier ``head``.

Build one by name with :func:`build_model`; :func:`model_names` lists the names and
:func:`default_model_for` gives the usual model of a dataset.

=============  ====================================================  ======================
name           architecture                                          feature_dim
=============  ====================================================  ======================
fmnist_cnn     FEMNIST/Fashion-MNIST CNN of the FedEM / FedRC code   2048
cifar_cnn      FedAvg CIFAR CNN (as in the FedNH code)               192
resnet18       CIFAR-style ResNet-18 (BatchNorm or GroupNorm(2, C))  8 * width (512)
mobilenet_v2   torchvision MobileNetV2, dropout + linear head        1280
mlp            two hidden ReLU layers of ``width`` (default 128)     width
lenet_small    tiny CNN for 8x8 digits                               64
convbn_cnn     DFL backbone: 3 x Conv-BN-ReLU (stride 2), 2-FC head  64*ceil(H/8)*ceil(W/8)
=============  ====================================================  ======================

``norm`` only affects models with normalisation layers (resnet18, mobilenet_v2); ``width`` is
accepted by resnet18 and mlp only; ``pretrained`` (ImageNet weights, needs internet) by resnet18
and mobilenet_v2 only; ``block_norm=False`` (resnet18 only) removes the normalisation inside the
residual branches and keeps it in the stem and the shortcuts (the FedNH code's ``--no_norm``).

Each builder registers itself in :data:`MODELS` where it is defined
(``@MODELS.register("resnet18")``); the options a model accepts are the ones its builder's
signature names.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import torch
from torch import nn

from fedshift.core.errors import FedshiftError, UnknownNameError
from fedshift.core.registry import Registry
from fedshift.models.base import (
    GROUPNORM_GROUPS,
    NORMS,
    SplitModel,
    body_param_names,
    check_norm,
    count_parameters,
    head_param_names,
)

__all__ = [
    "GROUPNORM_GROUPS",
    "MODELS",
    "NORMS",
    "SplitModel",
    "body_param_names",
    "build_model",
    "count_parameters",
    "default_model_for",
    "head_param_names",
    "model_names",
]

#: ``build(num_classes, input_shape, <options>) -> SplitModel``; the options it names among
#: ``norm``, ``width``, ``pretrained`` and ``block_norm`` are the ones the model accepts.
ModelBuilder = Callable[..., SplitModel]

_BUILDER_MODULES = ("cnn", "mlp", "mobilenet", "resnet")


def _import_builders() -> None:
    for module in _BUILDER_MODULES:
        importlib.import_module(f"{__name__}.{module}")


#: Every model builder by name; each builder module registers its own
#: (``@MODELS.register("resnet18")``) and is imported on the first lookup.
MODELS: Registry[ModelBuilder] = Registry("model", loader=_import_builders)

_DEFAULT_MODELS: dict[str, str] = {
    "mnist": "fmnist_cnn",
    "fmnist": "fmnist_cnn",
    "fashionmnist": "fmnist_cnn",
    "cifar10": "cifar_cnn",
    "cifar100": "cifar_cnn",
    "tinyimagenet": "resnet18",
    "tinyimagenet200": "resnet18",
    "digits": "lenet_small",
    "synthetic": "mlp",
}


def model_names() -> list[str]:
    """Names accepted by :func:`build_model`, sorted."""
    return MODELS.names()


def _options(builder: ModelBuilder) -> list[str]:
    """The options ``builder`` takes: its parameters after ``num_classes`` and ``input_shape``."""
    return list(inspect.signature(builder).parameters)[2:]


def _models_with(option: str) -> str:
    """The models taking ``option``, comma-separated, for error messages."""
    return ", ".join(n for n in MODELS.names() if option in _options(MODELS.get(n)))


def build_model(
    name: str,
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    pretrained: bool = False,
    norm: str = "batch",
    width: int | None = None,
    head_bias: bool = True,
    block_norm: bool = True,
) -> SplitModel:
    """Build model ``name`` for ``num_classes`` classes and inputs of shape ``input_shape``.

    ``input_shape`` is ``(C, H, W)`` for images and ``(D,)`` for tabular data. Raises
    :class:`UnknownNameError` for an unknown name and :class:`FedshiftError` for a bad option.
    """
    name = MODELS.canonical(name)
    builder = MODELS.get(name)
    accepted = _options(builder)
    check_norm(norm)
    if int(num_classes) < 1:
        raise FedshiftError(f"num_classes must be at least 1, got {num_classes}")
    if pretrained and "pretrained" not in accepted:
        raise FedshiftError(
            f"model {name!r} has no pretrained weights (available for: "
            f"{_models_with('pretrained')}); set model.pretrained=false"
        )
    if width is not None and "width" not in accepted:
        raise FedshiftError(
            f"model {name!r} has no width option (only {_models_with('width')}); "
            "leave model.width unset"
        )
    if not block_norm and "block_norm" not in accepted:
        raise FedshiftError(
            f"model {name!r} has no block_norm option (only {_models_with('block_norm')}); "
            "leave model.block_norm at true"
        )
    shape = tuple(int(s) for s in input_shape)
    opts = {"pretrained": pretrained, "norm": norm, "width": width, "block_norm": block_norm}
    model = builder(int(num_classes), shape, **{k: v for k, v in opts.items() if k in accepted})
    if not head_bias:
        model.head = _without_bias(model.head)
    return model


def _without_bias(head: nn.Module) -> nn.Module:
    """The head with its (last) linear layer's bias removed, weights kept."""
    if isinstance(head, nn.Linear):
        lin = nn.Linear(head.in_features, head.out_features, bias=False)
        with torch.no_grad():
            lin.weight.copy_(head.weight)
        return lin
    if isinstance(head, nn.Sequential):
        layers = list(head)
        last = max(i for i, m in enumerate(layers) if isinstance(m, nn.Linear))
        layers[last] = _without_bias(layers[last])
        return nn.Sequential(*layers)
    raise FedshiftError(f"model.head_bias=false: cannot remove the bias of a {type(head).__name__}")


def default_model_for(dataset: str) -> str:
    """The usual model of ``dataset`` (e.g. ``"cifar10"`` -> ``"cifar_cnn"``).

    Case, ``-`` and ``_`` are ignored, so aliases such as ``"CIFAR-10"`` or ``"tiny-imagenet-200"``
    work too.
    """
    key = dataset.lower().replace("-", "").replace("_", "")
    if key not in _DEFAULT_MODELS:
        raise UnknownNameError("dataset", dataset, sorted(_DEFAULT_MODELS))
    return _DEFAULT_MODELS[key]
