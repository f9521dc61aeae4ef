"""Derived random streams: one run seed, an independent generator per purpose.

Every random draw of a run comes from a seed derived from the run seed, a *stream id* naming
its purpose, and the integers that make it unique (round, client id, ...). Streams are
independent, so adding an algorithm or changing the executor does not change which clients are
sampled, and a resumed run draws exactly what an uninterrupted one would. All stream ids live
here, so two purposes can never share one by accident. This module is ground level: any layer
may import it.
"""

from __future__ import annotations

import numpy as np
import torch

# engine
SAMPLE_STREAM = 11  # client sampling, per round
SHUFFLE_STREAM = 12  # a client's mini-batch order (and augmentation), per round and client
INIT_STREAM = 20  # model initialisation, per model
WORK_STREAM = 13  # a client's local epochs under unequal local work, per round and client
# algorithms
NOISE_STREAM = 31  # FedRC's privacy noise on label statistics, per round and client
FEDRC_FT_STREAM = 32  # FedRC-FT's fine-tuning batch order, per round and client
FEDBABU_FT_STREAM = 33  # FedBABU's fine-tuning batch order
PROTO_STREAM = 34  # FedProto's initial global prototypes
CREFF_STREAM = 40  # CReFF's server-side draws (features, retraining, real-gradient batches)
FEDDAA_STREAM = 50  # FedDAA's K-means and the models it adds, per time step
FEDDRIFT_STREAM = 51  # FedDrift's new cluster models, per time step and client
FEDAVG_FT_STREAM = 52  # FedAvg + FT's fine-tuning batch order, per client
DFL_REFIT_STREAM = 53  # DFL's refitted read-out critic's batches, per round and client
# scenario data (numpy ``default_rng([scenario seed, stream, ...])``; the builders' own draws
# use the small literal ids 1..14 in fedshift.data)
LABEL_NOISE_STREAM = 60  # which clients are noisy; per client: which labels flip, and to what


def derive_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers (run seed, stream id, round, client, ...)."""
    return int(
        np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0]
        >> np.uint64(1)
    )


def generator(*parts: int) -> torch.Generator:
    """A CPU torch generator seeded by :func:`derive_seed` of ``parts``."""
    return torch.Generator().manual_seed(derive_seed(*parts))
