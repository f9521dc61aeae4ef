"""Experiments as library calls: several algorithms on one scenario, with their table and plots.

:func:`compare` is what ``fedshift compare`` runs; ``fedshift reproduce`` is
:func:`fedshift.studies.reproduce.reproduce_table`. Both print nothing: progress goes to optional
simulator callbacks or a listener of the jobs (:mod:`fedshift.studies.jobs`), results come
back as values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.algorithms import get_algorithm
from fedshift.algorithms.registry import algorithm_defaults, resolved_train
from fedshift.config import RunConfig, validate_config
from fedshift.core.errors import DivergedError, FedshiftError
from fedshift.core.files import atomic_write_text, ensure_writable_dir
from fedshift.data.federated import FederatedData
from fedshift.data.scenario import build_scenario
from fedshift.reporting.drift_report import COLUMNS, drift_markdown, drift_rows
from fedshift.reporting.plots import (
    plot_cluster_heatmaps,
    plot_drift,
    plot_history,
    plot_tasks,
    run_colors,
)
from fedshift.reporting.protocols import check_protocol
from fedshift.reporting.tables import table_rows, to_markdown
from fedshift.run.experiment import check_names
from fedshift.run.lock import removed_if_failed
from fedshift.studies.jobs import Job, Listener, RayPlacement, execute
from fedshift.tracking import with_group


@dataclass
class Comparison:
    """The runs of a comparison: each algorithm's metric history, those that diverged (with
    the round), the shared scenario, and the files written."""

    histories: dict[str, list[dict[str, Any]]]
    data: FederatedData
    out_dir: Path
    protocol: str
    diverged: dict[str, int] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    #: with a timeline: each method's drift measures (fedshift.reporting.drift_report)
    drift: list[dict[str, Any]] = field(default_factory=list)
    #: what a reader must know to compare the rows (training settings that differ)
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per finished algorithm at the protocol's round (see fedshift.reporting.tables)."""

        return table_rows(self.histories, self.protocol)


def algorithm_configs(
    base: RunConfig, algorithms: Sequence[str | tuple[str, dict[str, Any]]]
) -> dict[str, RunConfig]:
    """One validated config per algorithm (``name`` or ``(name, params)``); the base config's
    own algorithm keeps its params. Every mistake is raised before anything trains."""

    cfgs = {}
    for entry in algorithms:
        name, params = (entry, None) if isinstance(entry, str) else entry
        if params is None:
            params = base.algorithm.params if name == base.algorithm.name else {}
        raw = base.model_dump(mode="json")
        raw["algorithm"] = {"name": name, "params": params}
        raw["name"] = f"{base.name}/{name}"
        raw["output"]["plots"] = False
        with_group(raw, base.name)  # the compared runs' tracked runs, together
        cfg = validate_config(raw)
        check_names(cfg)  # the algorithm and its params, the dataset, model and styles
        cfgs[name] = cfg
    return cfgs


def training_notes(cfgs: dict[str, RunConfig]) -> list[str]:
    """One line per run that takes training settings from its algorithm's reference code
    (:meth:`~fedshift.config.RunConfig.algorithm_defaults`), and a warning when the compared
    runs train with different resolved settings of those keys."""

    lines, keys = [], set()
    for name, cfg in cfgs.items():
        took = algorithm_defaults(cfg)
        keys |= set(getattr(get_algorithm(cfg.algorithm.name), "reference_train", {}))
        if took:
            src = get_algorithm(cfg.algorithm.name).reference_train_source
            shown = ", ".join(f"train.{k}={v}" for k, v in took.items())
            lines.append(f"{name}: {shown} from its reference code ({src}); set it to override")
    for key in sorted(keys):
        values = {n: getattr(resolved_train(c), key) for n, c in cfgs.items()}
        if len(cfgs) > 1 and len(set(values.values())) > 1:
            each = ", ".join(f"{n} {v}" for n, v in values.items())
            lines.append(
                f"the rows train with different train.{key} ({each}): set train.{key} in the "
                "config to compare them under one setting"
            )
    return lines


def compare(
    base: RunConfig,
    algorithms: Sequence[str | tuple[str, dict[str, Any]]],
    *,
    protocol: str | None = None,
    data: FederatedData | None = None,
    callbacks: Callable[[str], list] | None = None,
    on_diverged: Callable[[str, DivergedError], None] | None = None,
    fresh: bool = False,
    workers: int = 1,
    listener: Listener | None = None,
    ray: RayPlacement | None = None,
    lockstep: bool | None = None,
) -> Comparison:
    """Run each algorithm on the same scenario and seed; write ``comparison.md``,
    ``comparison.png`` and (for clustered methods) ``clusters.png`` under
    ``<output.dir>/<name>/``. A run that diverges is recorded (``on_diverged`` hears of it) and
    the others go on. A run whose folder holds a checkpoint of the same settings is resumed
    (reused when finished), so calling again after an interruption trains only what is missing
    (``fresh``: every algorithm trains from round 1 again). The protocol defaults to ``steps``
    for a scenario with a timeline, else ``last``.

    The runs are jobs of :func:`fedshift.studies.jobs.execute`: in this process (``data``, when
    given, is their scenario; ``callbacks`` gives an algorithm's simulator callbacks), in
    ``workers`` local processes or, with ``ray``, as Ray tasks (progress: ``listener``); runs
    elsewhere build the scenario from the config, as the report here does without ``data``."""

    protocol = check_protocol(protocol or ("steps" if base.scenario.timeline else "last"))
    cfgs = algorithm_configs(base, algorithms)
    out = Path(base.output.dir) / base.name
    with removed_if_failed(out):  # e.g. a missing dataset: no empty folder left behind
        ensure_writable_dir(out)
        data = data or build_scenario(base.scenario, base.seed, base.data_dir)
        jobs = [Job(name, cfg) for name, cfg in cfgs.items()]
        where = {"workers": workers, "listener": listener, "ray": ray, "callbacks": callbacks}
        where["lockstep"] = lockstep
        scenarios = {cfg.scenario_hash(): data for cfg in cfgs.values()}
        outcomes = execute(jobs, fresh=fresh, scenarios=scenarios, **where)
        return _compare(base, cfgs, protocol, data, out, outcomes, on_diverged)


def _compare(base, cfgs, protocol, data, out, outcomes, on_diverged) -> Comparison:
    """:func:`compare` once its runs are done: the table, the plots and the drift report."""

    result = Comparison({}, data, out, protocol, notes=training_notes(cfgs))
    for o in outcomes:
        if o.status == "diverged":  # recorded; the others went on
            result.diverged[o.job.key] = o.diverged_round
            if on_diverged and o.error is not None:
                on_diverged(o.job.key, o.error)
        else:
            result.histories[o.job.key] = o.history
    if not result.histories:
        raise FedshiftError("every run diverged; lower train.lr")
    note = " ".join([f"Data: {data.source}.", *result.notes])
    if result.diverged:
        note += " Diverged: " + ", ".join(f"{a} (round {r})" for a, r in result.diverged.items())
    atomic_write_text(out / "comparison.md", to_markdown(result.rows(), protocol, note=note))
    result.files.append(out / "comparison.md")
    title = f"{base.name}: {data.name}"
    colors = run_colors(cfgs)  # by the algorithms asked for, diverged ones included
    result.files.append(
        plot_history(result.histories, out / "comparison.png", title=title, colors=colors)
    )
    if data.steps:
        if data.test_clients:
            result.files.append(plot_tasks(result.histories, out / "tasks.png", title=title))
        result.drift = drift_rows(result.histories, data, base.train.rounds)
        atomic_write_text(out / "drift.md", drift_markdown(result.drift))
        result.files.append(out / "drift.md")
        result.files.append(
            plot_drift(result.drift, COLUMNS[:-1], out / "drift.png", title=title, colors=colors)
        )
    concepts = [c.concept for c in data.clients]
    heat = {
        a: (h[-1]["clusters"], concepts) for a, h in result.histories.items() if "clusters" in h[-1]
    }
    if heat:
        title = "clients of each concept per cluster (last round)"
        result.files.append(plot_cluster_heatmaps(heat, out / "clusters.png", title=title))
    return result
