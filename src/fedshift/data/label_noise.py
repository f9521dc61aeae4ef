"""Label noise on the observed training labels of some clients (``scenario.label_noise``,
FedRC's Table 13): does a clustered method take noisy clients for a concept of their own?

A share ``clients`` of the training clients is noisy. On a noisy client every training label
is flipped, independently, with probability ``rate``, after the client's concept label map
(the noise is on the label the client observes):

- ``pair``: y -> (y + 1) mod C, the usual pair-flip convention;
- ``symmetric``: y -> a class drawn uniformly from the C - 1 other classes.

FedRC's paper names them the other way round ("Pairflip is to randomly convert the labels.
Symflip is to change y to (y+1)%10"); fedshift keeps the usual names (docs/scenarios.md).

Only training labels change: a noisy client's validation split, carved later from its training
split, keeps the noisy labels it was carved with; test splits and test-only clients stay clean.
Every draw comes from the stream :data:`~fedshift.core.seeds.LABEL_NOISE_STREAM` of the
scenario seed, so label noise never moves another draw of the scenario: with ``rate: 0`` (or no
``label_noise``) the arrays are those of the same scenario without it. The truth (which clients
are noisy, which samples flipped, from and to what) is each client's
:class:`~fedshift.data.federated.NoiseRecord`, summed up in ``data.meta["label_noise"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedshift.config.label_noise import LabelNoiseConfig
from fedshift.core.errors import ConfigError
from fedshift.core.seeds import LABEL_NOISE_STREAM
from fedshift.data.federated import FederatedData, NoiseRecord
from fedshift.data.partition import label_histogram


def noisy_positions(num_clients: int, fraction: float, seed: int) -> np.ndarray:
    """The (sorted) positions among ``num_clients`` training clients of the noisy ones:
    ``floor(fraction x num_clients + 0.5)`` of them, drawn at random (all when ``fraction``
    is 1)."""
    n = min(num_clients, int(np.floor(fraction * num_clients + 0.5)))
    order = np.random.default_rng([seed, LABEL_NOISE_STREAM]).permutation(num_clients)
    return np.sort(order[:n])


def flip_labels(
    y: np.ndarray, kind: str, rate: float, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``y`` whose label flips, their new labels): each position flips with
    probability ``rate``; ``pair`` to (y + 1) mod C, ``symmetric`` to a uniformly random other
    class."""
    pos = np.flatnonzero(rng.random(len(y)) < rate)
    old = np.asarray(y, dtype=np.int64)[pos]
    if kind == "pair":
        new = (old + 1) % num_classes
    elif kind == "symmetric":
        new = (old + rng.integers(1, num_classes, size=len(pos))) % num_classes
    else:  # the config allows only the two
        raise ConfigError(f"config: scenario.label_noise.kind: unknown kind {kind!r}")
    return pos, new


def apply_label_noise(data: FederatedData, cfg: LabelNoiseConfig, seed: int) -> None:
    """Flip the training labels of the noisy clients of ``data`` in place (before any
    validation split is carved), record each noisy client's :class:`NoiseRecord` and the
    summary in ``data.meta["label_noise"]``."""
    C = data.num_classes
    if C < 2:
        raise ConfigError(
            f"config: scenario.label_noise: the dataset has {C} class; a label can only flip "
            "between at least 2 classes; remove scenario.label_noise"
        )
    for i in noisy_positions(len(data.clients), cfg.clients, seed).tolist():
        c = data.clients[i]
        rng = np.random.default_rng([seed, LABEL_NOISE_STREAM, c.cid])
        y = c.y_train.cpu().numpy().astype(np.int64)
        pos, new = flip_labels(y, cfg.kind, cfg.rate, C, rng)
        idx = c.train_idx.cpu().numpy()[pos]
        order = np.argsort(idx, kind="stable")
        c.noise = NoiseRecord(idx=idx[order], original=y[pos][order], noisy=new[order])
        if len(pos):  # otherwise the client's arrays stay the very ones it had
            y = y.copy()
            y[pos] = new
            c.y_train = torch.from_numpy(y).to(c.y_train.device)
            c.label_hist = label_histogram(y, C)
    data.meta["label_noise"] = noise_summary(data, cfg)


def noise_summary(data: FederatedData, cfg: LabelNoiseConfig) -> dict[str, Any]:
    """Plain data for a run's summary: the settings, the noisy clients' ids and, per noisy
    client, its training samples and flipped labels (counted before a validation split)."""
    noisy = [c for c in data.clients if c.noise is not None]
    flipped = [len(c.noise) for c in noisy if c.noise is not None]
    samples = [c.num_train for c in noisy]
    return {
        "kind": cfg.kind,
        "rate": cfg.rate,
        "clients": cfg.clients,
        "noisy_clients": [c.cid for c in noisy],
        "flipped": flipped,  # per noisy client, in the order of noisy_clients
        "train_samples": samples,  # likewise
        "flipped_share": sum(flipped) / sum(samples) if sum(samples) else 0.0,
    }
