"""A real Flower deployment: the server's side of a run whose clients live on their nodes
(:mod:`~fedshift.flower.deploy.server`, :mod:`~fedshift.flower.deploy.server_run`) and a
node's side (:mod:`~fedshift.flower.deploy.node`). The ``fedshift deploy`` commands are in
:mod:`fedshift.cli.deploy`."""
