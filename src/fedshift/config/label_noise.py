"""The ``scenario.label_noise`` section: label noise on some training clients' observed
labels (FedRC's Table 13). Built by :mod:`fedshift.data.label_noise`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fedshift.config.base import Strict


class LabelNoiseConfig(Strict):
    """Label noise on some training clients' observed labels (FedRC's Table 13): per sample,
    with probability ``rate``, a noisy client's training (and validation) label is flipped,
    after its concept's label map. Test splits and test-only clients stay clean."""

    kind: Literal["pair", "symmetric"] = Field(
        description="pair: y -> (y+1) mod C; symmetric: y -> a uniformly random other class "
        "(the usual convention; FedRC's paper names them the other way round)"
    )
    rate: float = Field(ge=0, le=1, description="probability that a sample's label is flipped")
    clients: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="fraction of the training clients that are noisy (floor(clients x "
        "num_clients + 0.5) of them, drawn at random); the others keep clean labels",
    )

    def check_without_time(self, **time: Any) -> None:
        """Refuse a time key (``timeline``, ``drift``) that is set: label noise is defined for
        scenarios without time."""
        for key, value in time.items():
            if value is not None:
                raise ValueError(
                    f"label_noise is not supported with {key} (it is defined for scenarios "
                    f"without time); remove scenario.label_noise or scenario.{key}"
                )
