"""User-facing errors.

Every mistake a user can make (a bad config value, a missing dataset, an unknown name) raises a
:class:`FedshiftError`. The CLI prints its message on one line and exits with code 2, without a
traceback; programming errors keep their traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedshiftError(Exception):
    """A user mistake: the message names the problem and how to fix it."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate to a mistyped ``name`` (compared
    without case, spelled as the candidate is), else ``""``."""
    spelled = {str(c).lower(): str(c) for c in candidates}
    close = difflib.get_close_matches(str(name).lower(), list(spelled), n=1)
    return f" (did you mean {spelled[close[0]]!r}?)" if close else ""


class ConfigError(FedshiftError):
    """An invalid configuration value or key."""


class DatasetNotFoundError(FedshiftError):
    """A dataset could not be found locally nor downloaded."""


class UnknownNameError(FedshiftError):
    """An unknown algorithm, dataset, model, corruption or partitioner name."""

    def __init__(self, kind: str, name: str, allowed: list[str] | tuple[str, ...]) -> None:
        self.kind, self.name, self.allowed = kind, name, list(allowed)
        hint = did_you_mean(name, allowed)
        super().__init__(f"unknown {kind} {name!r}{hint}; allowed: {', '.join(sorted(allowed))}")

    def __reduce__(self):  # picklable, so it crosses from a worker process or a Ray task
        return type(self), (self.kind, self.name, self.allowed)


class DivergedError(FedshiftError):
    """Training diverged: a non-finite loss or parameter. The CLI exits with code 3."""

    exit_code = 3

    def __init__(self, rnd: int, what: str, lr: float | None = None) -> None:
        self.round, self.what, self.lr = rnd, what, lr
        self.run_dir: str | None = None  # set by the runner: where the run is recorded
        hint = f"lower train.lr (now {lr:g})" if lr is not None else "lower train.lr"
        super().__init__(
            f"training diverged in round {rnd}: {what}; {hint} or set train.grad_clip "
            "(e.g. train.grad_clip=10)"
        )

    def __reduce__(self):  # picklable with its run directory (worker processes, Ray tasks)
        return type(self), (self.round, self.what, self.lr), {"run_dir": self.run_dir}

    def __str__(self) -> str:
        text = super().__str__()
        return text if self.run_dir is None else f"{text} (recorded in {self.run_dir})"
