"""What a scenario's local test splits measure: a leakage audit and a single-model bound.

Clients are scored on their own test splits (``local_acc``). Two facts about those splits,
per time step (one row without time), computed from the scenario alone:

- **test leak**: the share of the step's test samples (over all clients) whose source image
  some client trained on *with the same label* at that step or before. A model can memorise
  such an image's label, so the split does not measure generalisation there. ``test_leak``
  counts the source image whatever its feature style (a rotated copy of a memorised image
  counts); ``test_leak_exact`` only the same input (same image, same style).
- **single-model bound**: the highest local accuracy one shared model can reach on test images
  it never trained on. A model sees the input only: for a source class ``r`` shown in style
  ``s`` it gives one label, right for the clients whose concept maps ``r`` to it, so the bound
  is ``Σ_(s,r) max_ℓ n[s, r, ℓ] / N`` over the step's test samples (``n``: samples of class
  ``r`` in style ``s`` labelled ``ℓ``). It holds when the clients' images of a class and style
  follow one distribution (the concepts are label maps of shared images); a method that beats
  it with one model must have seen test images before (see the leak).

FedDAA's code re-splits every data piece whenever it is loaded, so test images of step t were
trained on at earlier steps with the same label (spec feddaa.md §7.17); fedshift's default split
is fixed per piece and leaks nothing (``timeline.split``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedshift.data.federated import Client, FederatedData


def _keys(idx: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """One integer per (item, label) pair."""
    return idx.astype(np.int64) * num_classes + labels.astype(np.int64)


def leak_share(
    trained: Sequence[tuple[np.ndarray, np.ndarray]],
    tested: Sequence[tuple[np.ndarray, np.ndarray]],
    num_classes: int,
) -> float:
    """% of the ``tested`` (items, labels) whose (item, label) pair is among the ``trained``
    ones (items: any integer identity, e.g. source image or pool index); NaN without tests."""
    test = [_keys(i, y, num_classes) for i, y in tested]
    total = sum(len(k) for k in test)
    if total == 0:
        return float("nan")
    seen = np.unique(np.concatenate([_keys(i, y, num_classes) for i, y in trained] or [[]]))
    hits = sum(int(np.isin(k, seen).sum()) for k in test)
    return 100.0 * hits / total


def single_model_bound(styles: np.ndarray, classes: np.ndarray, labels: np.ndarray) -> float:
    """% of samples a single input-to-label function gets right at best when the input
    reveals only its style and source class: ``Σ_(s,r) max_ℓ n[s, r, ℓ] / N``."""
    if len(labels) == 0:
        return float("nan")
    cells = np.stack([styles, classes, labels], axis=1)
    uniq, counts = np.unique(cells, axis=0, return_counts=True)
    best: dict[tuple[int, int], int] = {}
    for (s, r, _), n in zip(uniq.tolist(), counts.tolist(), strict=True):
        best[(s, r)] = max(best.get((s, r), 0), n)
    return 100.0 * sum(best.values()) / len(labels)


def audit(data: FederatedData) -> list[dict[str, float]]:
    """Per time step (``step`` 0 without time): ``test_leak``, ``test_leak_exact`` and
    ``single_model_bound`` (all in %) of the clients' local test splits (see the module doc).
    No entry for a step without test splits, none when the data does not record where its
    images come from."""
    if data.origin is None or data.raw_label is None:
        return []
    steps: list[list[Client]] = data.steps or [data.clients]
    C = data.num_classes
    style_ids: dict[str, int] = {}
    out, src_trained, exact_trained = [], [], []
    for t, clients in enumerate(steps, start=1):
        for c in clients:
            idx = c.train_idx.cpu().numpy()
            src_trained.append((data.origin[idx], c.y_train.cpu().numpy()))
            exact_trained.append((idx, c.y_train.cpu().numpy()))
        tests = [(c.test_idx.cpu().numpy(), c.y_test.cpu().numpy(), c) for c in clients]
        styles = np.concatenate(
            [
                np.full(len(i), style_ids.setdefault(c.style.label(), len(style_ids)))
                for i, _, c in tests
            ]
            or [np.zeros(0, dtype=np.int64)]
        )
        idx_all = np.concatenate([i for i, _, _ in tests] or [np.zeros(0, dtype=np.int64)])
        y_all = np.concatenate([y for _, y, _ in tests] or [np.zeros(0, dtype=np.int64)])
        if len(y_all) == 0:  # no local test splits (e.g. FedNH's protocol): nothing to audit
            continue
        out.append(
            {
                "step": t if data.steps else 0,
                "test_leak": leak_share(src_trained, [(data.origin[i], y) for i, y, _ in tests], C),
                "test_leak_exact": leak_share(exact_trained, [(i, y) for i, y, _ in tests], C),
                "single_model_bound": single_model_bound(styles, data.raw_label[idx_all], y_all),
            }
        )
    return out
