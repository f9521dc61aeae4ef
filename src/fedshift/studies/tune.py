"""``fedshift compare --tune``: each method over a grid of hyper-parameters, the value chosen
per method on validation accuracy, never on a test metric, and the test metrics reported at
that value.

Every (method, grid value, seed) is a resumable run of its own. The choice is the value with
the highest mean over seeds of ``val_acc`` (every training client's accuracy on its validation
split, carved from its training data by ``scenario.validation_fraction``, with the model the
method gives it) at the protocol's round; ties go to the first value of the grid. The test
metrics (``local_acc``, ``global_acc``) are then read at that value, from the same runs. A
value at which a seed diverged is out of the choice (its diverged seeds are counted in the grid
table). Grid, validation scores, choices and test metrics go to ``tune.md`` and ``tune.json``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.config import RunConfig, apply_overrides, validate_config
from fedshift.config.grid import parse_choices
from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_write_text, ensure_writable_dir
from fedshift.reporting.protocols import PROTOCOLS, check_protocol, select_round
from fedshift.reporting.summary import Table, markdown, mean_std
from fedshift.studies.compare import algorithm_configs, training_notes
from fedshift.studies.jobs import Listener, RayPlacement, execute

#: short names of the tuned keys
ALIASES = {"lr": "train.lr", "momentum": "train.momentum", "weight_decay": "train.weight_decay"}
#: the test metrics reported at each method's chosen value
TEST_KEYS = (("local_acc", "local acc % (test)"), ("global_acc", "global acc % (test)"))


def parse_tune(specs: Sequence[str]) -> dict[str, list[Any]]:
    """``["lr=0.01,0.05", "algorithm.params.mu=0.1,1"]`` as {key: values} (``lr`` is
    ``train.lr``; the grammar of :func:`fedshift.config.grid.parse_choices`)."""
    return parse_choices(specs, flag="--tune", aliases=ALIASES)


@dataclass
class Tuned:
    """Each method's choice (``rows``), every grid point's validation score (``grid_rows``),
    the folder and its files."""

    rows: list[dict[str, Any]]
    grid_rows: list[dict[str, Any]]
    out_dir: Path
    title: str
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # training settings that differ


def _label(point: dict[str, Any]) -> str:
    return ",".join(f"{k.removeprefix('algorithm.params.').removeprefix('train.')}={v}"
                    for k, v in point.items())  # fmt: skip


def tune_configs(base: RunConfig, method: str, point: dict[str, Any], seed: int) -> RunConfig:
    """The validated config of one run: ``method`` at grid ``point``, seed ``seed``."""

    plain = [f"{k}={json.dumps(v)}" for k, v in point.items() if not k.startswith("algorithm.")]
    params = {k.removeprefix("algorithm.params."): v for k, v in point.items()
              if k.startswith("algorithm.params.")}  # fmt: skip
    bad = [k for k in point if k.startswith("algorithm.") and k not in
           {f"algorithm.params.{p}" for p in params}]  # fmt: skip
    if bad:
        raise FedshiftError(f"--tune {bad[0]}: tune algorithm.params.<name> or a config key")
    raw = apply_overrides(base.model_dump(mode="json"), [*plain, f"seed={seed}"])
    raw["name"] = f"{base.name}-tune/{_label(point)}/seed{seed}".replace(" ", "")
    one = validate_config(raw)
    own = dict(base.algorithm.params) if method == base.algorithm.name else {}
    return algorithm_configs(one, [(method, {**own, **params})])[method]


@dataclass(frozen=True)
class TuneRun:
    """One run of a tuning: ``method`` at the grid's point number ``point``, seed ``seed``."""

    method: str
    point: int
    label: str  # the point, e.g. lr=0.05
    seed: int
    cfg: RunConfig

    @property
    def key(self) -> str:
        return f"{self.method} {self.label} seed {self.seed}"


def tune_compare(
    base: RunConfig,
    methods: Sequence[str],
    grid: dict[str, list[Any]],
    *,
    seeds: int = 2,
    protocol: str = "last",
    callbacks: Callable[[str], list] | None = None,
    fresh: bool = False,
    workers: int = 1,
    listener: Listener | None = None,
    ray: RayPlacement | None = None,
    lockstep: bool | None = None,
) -> Tuned:
    """Run every method at every grid point and seed, choose each method's point on
    validation accuracy and report the test metrics there (module doc). The runs go through
    :func:`fedshift.studies.jobs.execute` (``workers``, ``ray``, ``listener``; ``callbacks``:
    simulator callbacks by a run's key, in this process; ``lockstep``: a method's grid points
    and seeds as one job); a value at which a seed diverged is not chosen."""

    if base.scenario.validation_fraction <= 0:
        raise FedshiftError(
            "compare --tune chooses on validation accuracy, never on test: set "
            "scenario.validation_fraction (e.g. scenario.validation_fraction=0.1)"
        )
    check_protocol(protocol)
    if "seed" in grid:
        raise FedshiftError(
            "--tune seed=...: the seeds are not a grid key; give their number with --seeds N "
            "(seeds seed, seed+1, ..., their mean decides)"
        )
    if seeds < 1:
        raise FedshiftError(f"--seeds must be at least 1, got {seeds}")
    points = [dict(zip(grid, vals, strict=True)) for vals in itertools.product(*grid.values())]
    plan = [
        TuneRun(m, i, _label(p), base.seed + s, tune_configs(base, m, p, base.seed + s))
        for m in methods
        for i, p in enumerate(points)
        for s in range(seeds)
    ]  # every config checked before anything trains
    out = Path(base.output.dir) / f"{base.name}-tune"
    ensure_writable_dir(out)
    where = {"workers": workers, "listener": listener, "ray": ray, "callbacks": callbacks}
    outcomes = execute(plan, fresh=fresh, lockstep=lockstep, **where)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    diverged: dict[tuple[str, int], int] = {}
    for o in outcomes:
        key = (o.job.method, o.job.point)
        if o.status == "diverged":  # this value is out of the choice (a seed diverged)
            diverged[key] = diverged.get(key, 0) + 1
            continue
        runs.setdefault(key, []).append(select_round(o.history, protocol))
    grid_rows, rows = [], []
    for m in methods:
        scores = {i: mean_std([e.get("val_acc", float("nan")) for e in runs.get((m, i), [])])
                  for i in range(len(points))}  # fmt: skip
        for i, p in enumerate(points):
            test = mean_std([e.get("local_acc", float("nan")) for e in runs.get((m, i), [])])
            grid_rows.append({"method": m, "point": _label(p), "val": scores[i], "local": test,
                              "diverged": diverged.get((m, i), 0)})  # fmt: skip
        ranked = [i for i in range(len(points)) if scores[i][2] > 0 and not diverged.get((m, i))]
        if not ranked:
            why = "every value diverged in a seed" if diverged else "no run recorded val_acc"
            raise FedshiftError(
                f"{m}: nothing to choose from ({why}); try smaller values, or set "
                "scenario.validation_fraction"
            )
        best = max(ranked, key=lambda i: (scores[i][0], -i))
        chosen = runs[(m, best)]
        rows.append({
            "method": m,
            "chosen": _label(points[best]),
            "val": scores[best],
            **{k: mean_std([e.get(k, float("nan")) for e in chosen]) for k, _ in TEST_KEYS},
        })  # fmt: skip
    title = (
        f"{base.name}: each method's {', '.join(grid)} chosen on validation accuracy "
        f"(val_acc: every training client's validation split, {base.scenario.validation_fraction:g}"
        f" of its training data), mean over seeds {base.seed}..{base.seed + seeds - 1} at the "
        f"{PROTOCOLS[protocol]}; test metrics at the chosen value"
    )

    firsts = {r.method: r.cfg for r in plan if r.point == 0 and r.seed == base.seed}
    tuned = Tuned(rows, grid_rows, out, title, notes=training_notes(firsts))
    files = [out / "tune.md", out / "tune.json"]
    atomic_write_text(files[0], tune_markdown(tuned))
    record = {"grid": grid, "seeds": seeds, "protocol": protocol, "notes": tuned.notes,
              "choices": rows, "scores": grid_rows}  # fmt: skip
    atomic_write_text(files[1], json.dumps(record, indent=2, default=str) + "\n")
    tuned.files = files
    return tuned


def choice_table(t: Tuned) -> Table:
    """Each method's chosen value, its validation score and the test metrics there."""
    cols = ["algorithm", "chosen", "val acc %", *(title for _, title in TEST_KEYS)]
    cells = [[r["method"], r["chosen"], r["val"].text(), *(r[k].text() for k, _ in TEST_KEYS)]
             for r in t.rows]  # fmt: skip
    return Table(cols, cells, t.title)


def grid_table(t: Tuned) -> Table:
    """Every grid point's validation score, and its test accuracy for reference."""
    cols = ["algorithm", "value", "val acc %", "local acc % (test)", "diverged seeds"]
    cells = [[g["method"], g["point"], g["val"].text(), g["local"].text(), g.get("diverged", 0)]
             for g in t.grid_rows]  # fmt: skip
    return Table(cols, cells, "every grid point (validation; test for reference)")


def tune_markdown(t: Tuned) -> str:
    """``tune.md``: the choices under the title, the notes, then every grid point."""
    notes = "\n".join(f"Note: {n}" for n in t.notes)
    return markdown(t.title, choice_table(t), notes, "Every grid point:", grid_table(t))


def tuned_tables(t: Tuned) -> list:
    """What ``fedshift compare --tune`` prints: every grid point, then each method's choice."""
    notes = ["note: " + line for line in t.notes]
    return [grid_table(t).to_rich(), choice_table(t).to_rich(), *notes]
