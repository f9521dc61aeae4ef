"""The registry every corruption adds itself to (the package imports the implementations)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedshift.core.registry import Registry

#: ``f(x, severity, rng) -> corrupted x``, float32 images [N, H, W, C] on ``[0, 1]``.
Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

#: Every corruption by name, in registration order: the order of the definitions in
#: :mod:`.cifar10c`, then in :mod:`.fmnistc` (imported below, in that order). That order is
#: :data:`fedshift.data.features.CORRUPTIONS`, which decides what "all" expands to: add a new
#: corruption at the end.
CORRUPTION_FUNCS: Registry[Corruption] = Registry("corruption")
