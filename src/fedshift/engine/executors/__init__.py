"""Executors: who trains a round's clients. The interface and the sequential executor
(:mod:`~fedshift.engine.executors.base`), clients batched under ``torch.func.vmap``
(:mod:`~fedshift.engine.executors.batched`, :mod:`~fedshift.engine.executors.stage`) and clients
on Ray actors (:mod:`~fedshift.engine.executors.ray_executor`, needs the ``ray`` extra)."""
