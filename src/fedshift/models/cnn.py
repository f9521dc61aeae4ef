"""Small convolutional networks used in the FL literature.

* :func:`build_fmnist_cnn`: the FEMNIST / Fashion-MNIST CNN of the FedEM and FedRC code.
* :func:`build_cifar_cnn`: the classic FedAvg CIFAR CNN (as in the FedNH code).
* :func:`build_lenet_small`: a tiny CNN for 8x8 digits, handy for fast tests.

The flatten size is computed from ``input_shape``, so every model works for other image sizes.
"""

from __future__ import annotations

from torch import nn

from fedshift.models import MODELS
from fedshift.models.base import (
    SplitModel,
    check_positive,
    conv_out,
    image_shape,
    make_norm2d,
)


def _two_conv_pool_stages(model: str, h: int, w: int) -> tuple[int, int]:
    """Spatial size after two (5x5 conv without padding, 2x2 max-pool) stages."""
    for stage in (1, 2):
        h, w = conv_out(h, 5) // 2, conv_out(w, 5) // 2
        check_positive(model, f"the height after stage {stage}", h)
        check_positive(model, f"the width after stage {stage}", w)
    return h, w


@MODELS.register("fmnist_cnn")
def build_fmnist_cnn(num_classes: int, input_shape: tuple[int, ...]) -> SplitModel:
    """Conv(C,32,5)-ReLU-Pool-Conv(32,64,5)-ReLU-Pool-FC(2048)-ReLU body, linear head."""
    c, h, w = image_shape("fmnist_cnn", input_shape)
    h, w = _two_conv_pool_stages("fmnist_cnn", h, w)
    flat = 64 * h * w
    feature_dim = 2048
    body = nn.Sequential(
        nn.Conv2d(c, 32, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(flat, feature_dim),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


@MODELS.register("cifar_cnn")
def build_cifar_cnn(num_classes: int, input_shape: tuple[int, ...]) -> SplitModel:
    """Conv(C,64,5)-ReLU-Pool-Conv(64,64,5)-ReLU-Pool-FC(384)-ReLU-FC(192)-ReLU body, linear head."""
    c, h, w = image_shape("cifar_cnn", input_shape)
    h, w = _two_conv_pool_stages("cifar_cnn", h, w)
    flat = 64 * h * w
    feature_dim = 192
    body = nn.Sequential(
        nn.Conv2d(c, 64, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(64, 64, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(flat, 384),
        nn.ReLU(),
        nn.Linear(384, feature_dim),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


@MODELS.register("lenet_small")
def build_lenet_small(num_classes: int, input_shape: tuple[int, ...]) -> SplitModel:
    """Conv(C,16,3,pad 1)-ReLU-Pool-FC(64)-ReLU body, linear head (for 8x8 digits)."""
    c, h, w = image_shape("lenet_small", input_shape)
    flat = 16 * check_positive("lenet_small", "the pooled size", (h // 2) * (w // 2))
    feature_dim = 64
    body = nn.Sequential(
        nn.Conv2d(c, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(flat, feature_dim),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


@MODELS.register("convbn_cnn")
def build_convbn_cnn(num_classes: int, input_shape: tuple[int, ...]) -> SplitModel:
    """DFL's verification backbone (spec dfl.md §5.3): three Conv(3x3, stride 2)-BN-ReLU groups
    of 16/32/64 channels as the body, Linear(d, 512)-ReLU-Linear(512, C) as the head."""
    c, h, w = image_shape("convbn_cnn", input_shape)
    layers: list[nn.Module] = []
    for c_in, c_out in ((c, 16), (16, 32), (32, 64)):
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), make_norm2d("batch", c_out)]
        layers.append(nn.ReLU())
        h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
    feature_dim = 64 * check_positive("convbn_cnn", "the feature map", h * w)
    body = nn.Sequential(*layers, nn.Flatten())
    head = nn.Sequential(nn.Linear(feature_dim, 512), nn.ReLU(), nn.Linear(512, num_classes))
    return SplitModel(body, head, feature_dim, num_classes)
