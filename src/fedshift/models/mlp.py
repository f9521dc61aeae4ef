"""A two-hidden-layer MLP for tabular / synthetic data or flattened small images."""

from __future__ import annotations

import math

from torch import nn

from fedshift.core.errors import FedshiftError
from fedshift.models import MODELS
from fedshift.models.base import SplitModel

DEFAULT_WIDTH = 128


@MODELS.register("mlp")
def build_mlp(
    num_classes: int, input_shape: tuple[int, ...], width: int | None = None
) -> SplitModel:
    """Flatten-Linear(D,width)-ReLU-Linear(width,width)-ReLU body, linear head; D=prod(shape)."""
    dims = tuple(int(s) for s in input_shape)
    if not dims or min(dims) <= 0:
        raise FedshiftError(f"model 'mlp' needs a non-empty positive input_shape, got {dims}")
    width = DEFAULT_WIDTH if width is None else int(width)
    if width <= 0:
        raise FedshiftError(f"model width must be positive, got {width}")
    body = nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(dims), width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(width, num_classes), width, num_classes)
