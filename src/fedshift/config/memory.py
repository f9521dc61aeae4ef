"""The ``memory`` section of a run's config, and sizes written for people (``4GB``)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from fedshift.config.base import Strict

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(value: Any) -> int:
    """Bytes of a size such as ``4GB``, ``512MiB``, ``1.5g`` or a plain number of bytes; the
    units are binary (a GB here is 2^30 bytes, as ``free -g`` counts)."""
    if isinstance(value, bool):
        raise ValueError("must be a size like 4GB or auto")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be a positive size, e.g. 4GB")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; write e.g. 4GB, 512MB or auto")
    unit = (m.group(2) or "").lower().replace("ib", "").replace("b", "")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError("must be a positive size, e.g. 4GB")
    return size


class MemoryConfig(Strict):
    """How much memory a run may hold (see :mod:`fedshift.engine.memory`)."""

    budget: int | str = Field(
        default="auto",
        description="the resident memory the run plans to use (once client states spill, the "
        "measured peak may pass it by a few percent): client states beyond it go to disk (the "
        "run directory's store/), training and scoring go in chunks that fit, and a run that "
        "cannot fit is refused before training; a size (4GB, 512MB) or auto = 15% of the "
        "memory available when the run starts (or the least the run needs, if more)",
    )

    @field_validator("budget")
    @classmethod
    def _size(cls, v: int | str) -> int | str:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        return parse_size(v)
