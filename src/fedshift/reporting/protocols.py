"""The round-selection protocols of the reports: which evaluation of a run a table shows
(:data:`PROTOCOLS`). The metrics themselves are defined in :mod:`fedshift.engine.metrics`."""

from __future__ import annotations

import math
from typing import Any

from fedshift.core.errors import FedshiftError, did_you_mean

PROTOCOLS = {
    "last": "last evaluated round",
    "best": "round of best global accuracy",
    "best_gm": "round of best global-model accuracy (GM)",
    "best_train": "round of best train accuracy (FedRC's protocol)",
    "best_val": "round of best validation accuracy (scenario.validation_fraction)",
    "steps": "mean over the time steps of each step's last evaluation (FedDAA's protocol)",
    "top5": "mean of the 5 evaluations with the best local accuracy (FedGen's code, DFL)",
}


def check_protocol(name: str) -> str:
    """``name`` if it is a protocol of :data:`PROTOCOLS`, else a one-line error with the closest
    name and the allowed ones."""
    if name not in PROTOCOLS:
        hint = did_you_mean(name, PROTOCOLS)
        raise FedshiftError(f"--protocol {name!r}{hint}: allowed: {', '.join(PROTOCOLS)}")
    return name


def select_round(history: list[dict[str, Any]], protocol: str) -> dict[str, Any]:
    """The evaluation entry a report uses under ``protocol`` (see PROTOCOLS)."""
    if not history:
        raise ValueError("no evaluation in the history")
    if protocol == "last":
        return history[-1]
    if protocol == "steps":
        return step_average(history)
    if protocol == "top5":
        return top_average(history, "local_acc", 5)
    key = {
        "best": "global_acc",
        "best_train": "train_acc",
        "best_gm": "gm_acc",
        "best_val": "val_acc",
    }.get(protocol)
    if key is None:
        raise ValueError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    scored = [h for h in history if isinstance(h.get(key), float) and not math.isnan(h[key])]
    if not scored:
        return history[-1]
    return max(scored, key=lambda h: (h[key], h["round"]))


def top_average(history: list[dict[str, Any]], key: str, n: int) -> dict[str, Any]:
    """Every numeric metric averaged over the ``n`` evaluations with the highest ``key`` (the
    FedGen code's report, which DFL's setup follows; ``round``: the best one's)."""
    scored = [h for h in history if isinstance(h.get(key), float) and not math.isnan(h[key])]
    if not scored:
        return history[-1]
    top = sorted(scored, key=lambda h: (h[key], h["round"]), reverse=True)[:n]
    out: dict[str, Any] = {"round": top[0]["round"], "evaluations_averaged": len(top)}
    for k, v in top[0].items():
        vals = [h[k] for h in top if isinstance(h.get(k), int | float)]
        if k != "round" and isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = sum(vals) / len(vals)
    return out


def step_ends(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each time step's last evaluation, in step order (empty without time steps)."""
    ends = {h["step"]: h for h in history if "step" in h}
    return [ends[t] for t in sorted(ends)]


def step_average(history: list[dict[str, Any]]) -> dict[str, Any]:
    """FedDAA's "average over all clients and all time steps": each step's last evaluation,
    every metric averaged over the steps that record it (``round``: the last one). Also, from the test tasks'
    accuracies (``global_acc_<task>``): their values at the last step (``last_...``) and the
    forgetting, the mean over tasks of (best accuracy at an earlier step end - the last one).
    Without time steps: the last evaluation."""
    rows = step_ends(history)
    if not rows:
        return history[-1]
    out: dict[str, Any] = {"round": rows[-1]["round"], "steps_averaged": len(rows)}
    for k in rows[-1]:
        vals = [r[k] for r in rows if isinstance(r.get(k), int | float)]
        if k not in ("round", "step") and isinstance(rows[-1][k], int | float):
            out[k] = sum(vals) / len(vals)  # over the steps that record it (RDLD's: from 2)
    tasks = [k for k in rows[-1] if k.startswith("global_acc_c")]
    out.update({f"last_{k}": rows[-1][k] for k in tasks})
    if len(rows) > 1 and tasks:
        drops = [max(r.get(k, float("nan")) for r in rows[:-1]) - rows[-1][k] for k in tasks]
        out["forgetting"] = sum(drops) / len(drops)
    return out
