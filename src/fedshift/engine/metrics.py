"""Metrics, each named for what it is, and the round-selection protocols of the reports.

- ``global_acc``: mean accuracy over the test-only clients (one per concept, built from the
  official test set, never trained on) — FedRC's main metric; ``global_acc_c<k>`` per concept.
- ``local_acc``: accuracy of the participating clients on their own test splits, pooled over
  samples (FedRC's code weights clients by test-sample count); ``local_acc_client_mean`` is the
  unweighted mean over clients.
- ``train_acc`` / ``train_loss``: the same over the clients' train splits (FedRC picks the
  round with the best ``train_acc``).

FedNH's protocol (``eval.personal``), all scored on the test-only client of the client's
concept (the official, class-balanced test set in FedNH's single-concept setting):

- ``gm_acc``: the method's single global model, plain top-1 accuracy over all test-only clients
  (absent for methods without a global model: "n/a" in reports, never a number);
- ``pm_v`` / ``pm_l``: each personalised model's class-weighted accuracy, classes weighted
  uniformly over the client's seen training classes (PM(V)) or by its training label
  distribution (PM(L)), averaged over the scored clients; ``*_std`` is the spread over clients
  and ``*_worst10`` the mean of the worst 10% of clients (at least one).

Every evaluation also records wall-clock seconds (:data:`TIMING_KEYS`): ``train_s`` (the
round's client tasks, training and aggregation), ``eval_s`` (its evaluation) and ``elapsed_s``
(the run so far). They vary between identical runs, so comparisons of runs leave them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

#: the wall-clock entries of an evaluation (not results: they differ between identical runs)
TIMING_KEYS = ("train_s", "eval_s", "elapsed_s")


def correct_count(probs: torch.Tensor, y: torch.Tensor) -> int:
    """Number of samples whose arg-max class equals the label."""
    if y.numel() == 0:
        return 0
    return int((probs.argmax(dim=-1) == y).sum())


def nll_sum(probs: torch.Tensor, y: torch.Tensor, eps: float = 1e-12) -> float:
    """Summed negative log-likelihood of the labels under ``probs``."""
    if y.numel() == 0:
        return 0.0
    p = probs.gather(1, y.view(-1, 1)).clamp_min(eps)
    return float(-p.log().sum())


def pooled_and_mean(correct: Sequence[int], totals: Sequence[int]) -> tuple[float, float]:
    """(sample-pooled accuracy, unweighted mean of per-client accuracies), in percent."""
    tot = sum(totals)
    pooled = 100.0 * sum(correct) / tot if tot else float("nan")
    per = [100.0 * c / t for c, t in zip(correct, totals, strict=True) if t]
    return pooled, (sum(per) / len(per) if per else float("nan"))


def clustering_scores(assigned: Sequence[int], truth: Sequence[Any]) -> tuple[float, float]:
    """(adjusted Rand index, normalised mutual information) of a clustering against labels."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    if len(assigned) < 2:
        return float("nan"), float("nan")
    codes = {t: i for i, t in enumerate(dict.fromkeys(truth))}
    t = [codes[x] for x in truth]
    return float(adjusted_rand_score(t, assigned)), float(normalized_mutual_info_score(t, assigned))


def clustering_diagnostics(
    assigned: Sequence[int],
    concept: Sequence[int],
    style: Sequence[str],
    dominant_label: Sequence[int],
    noisy: Sequence[bool] | None = None,
) -> dict[str, float]:
    """ARI/NMI of the clients' clusters against the true concept, the feature style and the
    dominant label (and, given ``noisy``, whether a client has label noise: ``ari_noise``,
    ``nmi_noise``). FedRC's principle: high against concepts, near 0 against the others."""
    out = {}
    truths: list[tuple[str, Sequence[Any]]] = [
        ("concept", concept),
        ("style", style),
        ("label", dominant_label),
    ]
    if noisy is not None:
        truths.append(("noise", noisy))
    for name, truth in truths:
        ari, nmi = clustering_scores(assigned, truth)
        out[f"ari_{name}"], out[f"nmi_{name}"] = ari, nmi
    return out


def per_class_counts(
    pred: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct predictions per class, samples per class), float64 vectors of ``num_classes``."""
    hit = y[pred == y]
    correct = torch.bincount(hit, minlength=num_classes).double()
    count = torch.bincount(y, minlength=num_classes).double()
    return correct.cpu(), count.cpu()


def class_weighted_accuracy(
    correct: torch.Tensor, count: torch.Tensor, weights: torch.Tensor
) -> float:
    """sum_c w_c correct_c / sum_c w_c n_c in percent: FedNH's acc_i with class weights α_i
    (NaN when no weighted class has test samples)."""
    w = weights.double().cpu()
    den = float((w * count).sum())
    return 100.0 * float((w * correct).sum()) / den if den > 0 else float("nan")


def pm_weights(label_hist: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Class weights of PM(V) (1 for every class seen in training) and PM(L) (the training
    label distribution) from a client's training label counts."""
    h = torch.as_tensor(label_hist, dtype=torch.float64)
    total = float(h.sum())
    return (h > 0).double(), (h / total if total > 0 else h)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, population std, mean of the worst 10% — at least one value) of per-client
    scores, ignoring NaN; all NaN when there is none."""
    v = sorted(x for x in values if not math.isnan(x))
    if not v:
        return float("nan"), float("nan"), float("nan")
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
    k = max(1, math.ceil(0.1 * len(v)))
    return mean, std, sum(v[:k]) / k
