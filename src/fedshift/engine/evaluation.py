"""Evaluation over all clients (not only the sampled ones) and all test-only clients."""

from __future__ import annotations

from typing import Any

import torch

from fedshift.algorithms.base import Algorithm, ClientData, State
from fedshift.data.scenario import Client, FederatedData
from fedshift.metrics import correct_count, nll_sum, pooled_and_mean


def client_data(data: FederatedData, client: Client, eval_batch: int = 1024) -> ClientData:
    """The algorithm's view of a client: its train split (or a test client's labelled split)."""
    return ClientData(
        cid=client.cid,
        train_idx=client.train_idx,
        y_train=client.y_train,
        inputs=data.inputs,
        eval_batch=eval_batch,
    )


@torch.no_grad()
def evaluate(
    algo: Algorithm,
    server: State,
    client_states: dict[int, State],
    data: FederatedData,
    train_metrics: bool = True,
    eval_batch: int = 1024,
) -> dict[str, Any]:
    """All metrics of one evaluation (see :mod:`fedshift.metrics` for their definitions)."""
    out: dict[str, Any] = {}
    te_c, te_n, tr_c, tr_n, tr_loss = [], [], [], [], 0.0
    for c in data.clients:
        state = client_states.get(c.cid) or algo.init_client_state(c.cid)
        view = client_data(data, c, eval_batch)
        probs = algo.predict(server, state, view, c.test_idx)
        te_c.append(correct_count(probs, c.y_test))
        te_n.append(c.num_test)
        if train_metrics:
            probs = algo.predict(server, state, view, c.train_idx)
            tr_c.append(correct_count(probs, c.y_train))
            tr_n.append(c.num_train)
            tr_loss += nll_sum(probs, c.y_train)
    out["local_acc"], out["local_acc_client_mean"] = pooled_and_mean(te_c, te_n)
    if train_metrics:
        out["train_acc"], _ = pooled_and_mean(tr_c, tr_n)
        out["train_loss"] = tr_loss / max(1, sum(tr_n))
    if data.test_clients:
        per = []
        for c in data.test_clients:
            view = client_data(data, c, eval_batch)
            state = algo.adapt_test_client(server, view)
            probs = algo.predict(server, state, view, c.test_idx)
            acc = 100.0 * correct_count(probs, c.y_test) / max(1, c.num_test)
            out[f"global_acc_c{c.concept}"] = acc
            per.append(acc)
        out["global_acc"] = sum(per) / len(per)
    return out
