"""Any fedshift algorithm as a Flower app (issue 13): the server side (client tasks,
aggregation, clustering state, evaluation) as a Flower ServerApp, local training as a
ClientApp, the scenario's clients as Flower nodes (SuperNodes).

- :mod:`~fedshift.flower.codec`: jobs and results as Flower records;
- :mod:`~fedshift.flower.executor`: ``FlowerExecutor``, fedshift's executor on a Flower ``Grid``;
- :mod:`~fedshift.flower.client_app` / :mod:`~fedshift.flower.server_app`: the two apps
  (``app`` in each is the component ``flwr run`` loads; see ``examples/flower/``);
- :mod:`~fedshift.flower.simulation`: ``fedshift flower``, the apps in Flower's simulation
  engine;
- a deployment, each node on its own data: :mod:`~fedshift.flower.deploy.node` (a node's store,
  jobs and privacy guard), :mod:`~fedshift.flower.deploy.server` (the server's link to the nodes),
  :mod:`~fedshift.flower.deploy.server_run` (the run), :mod:`~fedshift.flower.security` (TLS,
  node keys) and :mod:`~fedshift.cli.deploy` (``fedshift deploy``).

Flower is an extra (``pip install 'fedshift[flower]'``); nothing here is imported by the rest
of fedshift.
"""

from __future__ import annotations

from fedshift.core.errors import FedshiftError

EXTRA_HINT = "pip install 'fedshift[flower]'"


def require_flower() -> None:
    """A one-line error naming the extra when Flower (with its simulation engine) is missing."""
    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        raise FedshiftError(f"the Flower adapter needs Flower and Ray: {EXTRA_HINT}") from None
