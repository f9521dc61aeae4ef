"""Local training: each client trains its own model alone and never communicates.

For a global (test-only client) score, the server holds the sample-weighted average of the
latest local models, as FedRC's Appendix H.5 does for methods without a global model. That
average is no trained model, so Local has no ``global_model``: FedNH's GM is "n/a" for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    clone_params,
    weighted_average,
)
from fedshift.algorithms.capabilities import Personalised, own_model
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import OwnModel, SharedInit


class LocalServer(SharedInit):
    latest: dict  # client id -> (samples, params, buffers) of its latest model


@register
class Local(Personalised, Algorithm):
    """Each client keeps and trains its own model, starting from a common initialisation."""

    name = "local"
    #: the server averages the local models (its ``params``)
    shared_state_keys = frozenset({"params", "buffers"})
    paper = "baseline: each client trains alone, no communication"
    ServerState = LocalServer
    ClientState = OwnModel

    def init_server_state(self, init):
        params, buffers = init[0]
        # "init" is every client's starting point; "params" the average of the local models
        return {
            "init_params": params,
            "init_buffers": buffers,
            "params": clone_params(params),
            "buffers": clone_params(buffers),
            "latest": {},
        }

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        p, b = own_model(client, (server["init_params"], server["init_buffers"]))
        return LocalTask(params=[p], buffers=[b])

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {"params": result.params[0], "buffers": result.buffers[0]}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        latest = dict(server["latest"])
        for r in results:
            latest[r.cid] = (r.num_samples, r.params[0], r.buffers[0])
        if not latest:
            return server
        vals = list(latest.values())
        w = [v[0] for v in vals]
        return {
            **server,
            "latest": latest,
            "params": weighted_average([v[1] for v in vals], w),
            "buffers": weighted_average([v[2] for v in vals], w),
        }

    def mixture(self, server: State, client: State, data: ClientData):
        return self.own_mixture(server, client, data)
