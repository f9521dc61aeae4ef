"""Downloading torchvision's ImageNet weights, with a clear error when there is no network."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from fedshift.core.errors import FedshiftError

log = logging.getLogger(__name__)


def download_state_dict(model: str, url: str) -> dict[str, Tensor]:
    """Download (or read from the torch hub cache) the state dict at ``url``.

    Any failure (no internet, HTTP error, corrupt file) becomes a :class:`FedshiftError` that tells
    the user to train from scratch instead.
    """
    try:
        state = torch.hub.load_state_dict_from_url(
            url, map_location="cpu", progress=False, check_hash=True
        )
    except Exception as exc:  # any download problem means the same thing to the user
        raise FedshiftError(
            f"pretrained weights for {model} could not be downloaded (no internet?); "
            "set model.pretrained=false to train from scratch"
        ) from exc
    return dict(state)


def report_loading(model: str, loaded: list[str], skipped: list[str]) -> None:
    """Log how many pretrained tensors were loaded and which were skipped (shape mismatch)."""
    log.info(
        "%s: loaded %d pretrained tensors, skipped %d with mismatched shapes: %s",
        model,
        len(loaded),
        len(skipped),
        ", ".join(skipped) or "-",
    )
