"""The ``scenario.drift`` section: drift at any round, declared as events.

Each client keeps its own partition (``scenario.label_shift``) for the whole run and starts on
a concept of ``start``. Events then change what a client holds from a round on, in the order
they are listed (a later event continues from the state an earlier one left):

- ``sudden``: from ``at`` the client has concept ``to``;
- ``gradual``: from ``at`` a growing share of its samples follows ``to``, ``1/over``,
  ``2/over``, ... until all do at ``at + over - 1``;
- ``incremental``: its images change a little every round for ``over`` rounds, a rotation
  growing to ``style: rotate:<degrees>`` or a corruption's severity growing 1..5
  (``style: fog``), in at most ``levels`` distinct values;
- ``recurrent``: from ``at`` it visits ``concepts`` in turn, ``period`` rounds each, or, with
  ``switch_prob``, moves to another of them with that probability every round;
- ``label_swap``: its labels of every pair in ``pairs`` are swapped from ``at`` on (a new
  concept: its concept's label map followed by the swaps, FedCCFA's drift);
- ``label``: its P(y) moves: from ``at`` (over ``over`` rounds) its samples come from a second
  partition of the data, drawn like the first, so the label distribution changes and the
  concept does not;
- ``participation``: from ``at`` until ``until`` the clients it names (or those on
  ``concept``) take part in a round with probability ``rate``; the data does not change.

``at`` is a round, or ``[first, last]``: each client of the event then drifts at its own round,
drawn uniformly (staggered onset). ``clients`` is a share of the clients (a random subset) or
their ids. A FedDrift change-point file (rows = time steps, columns = clients, entries =
concept ids) is read with ``schedule: {file, rounds_per_row}`` instead of ``start``/``events``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from fedshift.config.base import ConceptIndex, Strict


class _Event(Strict):
    at: int | tuple[int, int] = Field(
        description="the onset round, or [first, last]: each client its own (staggered)"
    )
    clients: float | list[int] = Field(
        default=1.0,
        description="a share of the clients (a random subset, at least one) or their ids",
    )

    @field_validator("at")
    @classmethod
    def _at(cls, v):
        lo, hi = (v, v) if isinstance(v, int) else v
        if lo < 2:
            raise ValueError(f"at={lo}: a drift starts at round 2 or later (round 1 is the start)")
        if hi < lo:
            raise ValueError(f"at=[{lo}, {hi}]: the last onset round is before the first")
        return v

    @field_validator("clients")
    @classmethod
    def _clients(cls, v):
        if isinstance(v, float | int) and not isinstance(v, list) and not 0 < v <= 1:
            raise ValueError(f"clients={v}: a share must be in (0, 1], or give a list of ids")
        if isinstance(v, list) and not v:
            raise ValueError("clients=[]: name at least one client")
        if isinstance(v, list) and any(c < 0 for c in v):
            bad = next(c for c in v if c < 0)
            raise ValueError(
                f"clients={v}: client ids are 0 or more (0 .. num_clients-1; {bad} is not), "
                "or give a share in (0, 1]"
            )
        return v

    @property
    def onset_range(self) -> tuple[int, int]:
        return (self.at, self.at) if isinstance(self.at, int) else tuple(self.at)


class Sudden(_Event):
    kind: Literal["sudden"]
    to: ConceptIndex = Field(description="the concept the clients move to")


class Gradual(_Event):
    kind: Literal["gradual"]
    to: ConceptIndex = Field(description="the concept a growing share of the samples follows")
    over: int = Field(ge=2, description="rounds of the ramp (all samples follow `to` at its end)")


class Incremental(_Event):
    kind: Literal["incremental"]
    style: str = Field(
        description="where the images end: rotate:<degrees> (the angle grows) or a corruption "
        "name (its severity grows 1..5)"
    )
    over: int = Field(ge=1, description="rounds of the ramp")
    levels: int = Field(default=8, ge=1, description="distinct image styles on the way (memory)")


class Recurrent(_Event):
    kind: Literal["recurrent"]
    concepts: list[ConceptIndex] = Field(min_length=2, description="the concepts visited")
    period: int | None = Field(default=None, ge=1, description="rounds per visit (in turn)")
    switch_prob: float | None = Field(
        default=None, gt=0, le=1, description="instead of period: move every round with this p"
    )

    @model_validator(mode="after")
    def _one(self) -> Recurrent:
        if (self.period is None) == (self.switch_prob is None):
            raise ValueError("recurrent needs one of period (in turn) or switch_prob (at random)")
        return self


class LabelSwap(_Event):
    kind: Literal["label_swap"]
    pairs: list[tuple[int, int]] = Field(
        default_factory=lambda: [(0, 1)], min_length=1, description="class pairs swapped"
    )

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v):
        flat = [c for p in v for c in p]
        if any(c < 0 for c in flat) or len(set(flat)) != len(flat) or any(a == b for a, b in v):
            raise ValueError(f"pairs={v}: each class at most once, two different classes a pair")
        return v


class LabelDrift(_Event):
    kind: Literal["label"]
    over: int = Field(default=1, ge=1, description="rounds of the move (1: sudden)")


class Participation(_Event):
    kind: Literal["participation"]
    rate: float = Field(ge=0, le=1, description="probability that such a client takes part")
    until: int | None = Field(default=None, ge=2, description="first round back to normal")
    concept: ConceptIndex | None = Field(
        default=None, description="only the clients on this concept (at each round)"
    )


DriftEvent = Annotated[
    Sudden | Gradual | Incremental | Recurrent | LabelSwap | LabelDrift | Participation,
    Field(discriminator="kind"),
]

#: the event kinds, in the order of the docs
EVENT_KINDS = (
    "sudden",
    "gradual",
    "incremental",
    "recurrent",
    "label_swap",
    "label",
    "participation",
)


class ScheduleFile(Strict):
    """A FedDrift change-point matrix: one row per time step, one column per client, each
    entry the client's concept id (whitespace separated, ``.cp``)."""

    file: str = Field(description="path of the matrix (relative paths: to the working folder)")
    rounds_per_row: int = Field(default=1, ge=1, description="rounds each row lasts")
    sha256: str | None = Field(
        default=None,
        description="the file's content hash, recorded in a run's config.yaml when it starts: "
        "a file whose content differs is refused (a resumed run never mixes two schedules)",
    )

    def content_sha256(self) -> str | None:
        """The sha256 of the file's bytes as it is now (None: no readable file there)."""
        try:
            return hashlib.sha256(Path(self.file).read_bytes()).hexdigest()
        except OSError:
            return None

    def identity(self) -> str | None:
        """The content this schedule stands for: the recorded ``sha256``, else the file's."""
        return self.sha256 or self.content_sha256()


class DriftConfig(Strict):
    """Drift at any round: every client's concept, images, label distribution and availability
    per round, from ``start`` and ``events`` (or a change-point ``schedule``)."""

    rounds: int = Field(ge=2, description="rounds of the run (train.rounds)")
    start: list[ConceptIndex] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="the concepts at round 1, dealt round robin in a random client order",
    )
    events: list[DriftEvent] = Field(default_factory=list)
    schedule: ScheduleFile | None = None

    @model_validator(mode="after")
    def _rounds(self) -> DriftConfig:
        for i, ev in enumerate(self.events):
            lo, hi = ev.onset_range
            if hi > self.rounds:
                raise ValueError(f"events.{i}: at={hi} is after the last round ({self.rounds})")
            if isinstance(ev, Participation) and ev.until is not None and ev.until <= hi:
                raise ValueError(f"events.{i}: until={ev.until} is not after at")
        if self.schedule is not None and (self.events or self.start != [0]):
            raise ValueError("give either schedule (a change-point file) or start/events")
        return self

    def concepts_used(self) -> list[int]:
        """Every concept index the section names (checked against scenario.concepts)."""
        out = list(self.start)
        for ev in self.events:
            out += [ev.to] if isinstance(ev, Sudden | Gradual) else []
            out += ev.concepts if isinstance(ev, Recurrent) else []
            out += [ev.concept] if isinstance(ev, Participation) and ev.concept is not None else []
        return out
