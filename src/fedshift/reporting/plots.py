"""PNG plots: metric curves of one or many runs, and a scenario's clients."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

from fedshift.data.truth import (
    concept_changes,
    concept_schedule,
    onset_schedule,
    round_steps,
    step_boundaries,
    style_schedule,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

CURVES = [
    ("global_acc", "global accuracy (%) — test-only clients"),
    ("local_acc", "local accuracy (%) — clients' own test splits"),
    ("train_loss", "train loss (NLL) — clients' train splits"),
    ("ari_concept", "ARI of the clusters vs the true concepts"),
    ("gm_acc", "GM accuracy (%) — global model"),
    ("pm_v", "PM(V) (%) — personalised models, seen classes"),
    ("pm_l", "PM(L) (%) — personalised models, label-weighted"),
]


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def run_colors(names: Iterable[str]) -> dict[str, Any]:
    """One colour per run (an algorithm, a table row), by its place in ``names``: a run keeps
    its colour in every panel and every figure drawn with this map, whether or not the panels
    before it have a line of it (FedAvg has no ARI)."""
    names = list(dict.fromkeys(names))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def plot_history(
    runs: dict[str, list[dict[str, Any]]],
    path: str | Path,
    title: str = "",
    colors: dict[str, Any] | None = None,
) -> Path:
    """One panel per metric (global acc, local acc, train loss, ...), one line per run, each
    run in its colour of ``colors`` (default: :func:`run_colors` of the runs) in every panel;
    the legend lists every run."""
    colors = {**run_colors(runs), **(colors or {})}
    keys = [
        (k, lab)
        for k, lab in CURVES
        if any(k in h and not _nan(h[k]) for hs in runs.values() for h in hs)
    ]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 3.6))
    axes = np.atleast_1d(axes)
    for ax, (key, label) in zip(axes, keys, strict=False):
        for name, hist in runs.items():
            pts = [(h["round"], h[key]) for h in hist if key in h and not _nan(h[key])]
            if pts:
                marker = "o" if len(pts) < 30 else None
                ax.plot(
                    *zip(*pts, strict=True), label=name, color=colors[name], marker=marker, ms=3
                )
        ax.set_xlabel("round")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[name], marker="o", ms=3) for name in runs]
    axes[0].legend(handles, list(runs), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, Path(path))


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def style_colours(names: list[str]) -> list[Any]:
    """One distinct colour per feature style: ``clean`` white, the others from tab20 and
    then tab20b (up to 40 styles before a colour repeats)."""
    palette = [plt.get_cmap("tab20")(i) for i in range(20)]
    palette += [plt.get_cmap("tab20b")(i) for i in range(20)]
    others = iter(palette * (1 + len(names) // len(palette)))
    return [(1.0, 1.0, 1.0, 1.0) if n == "clean" else next(others) for n in names]


def plot_scenario(data, path: str | Path, max_clients: int = 120) -> Path:
    """Label histogram per client (stacked bars), with strips for concept and feature style."""
    clients = data.clients[:max_clients]
    hist = np.stack([c.label_hist for c in clients])
    C = hist.shape[1]
    fig, (ax, ax_c, ax_s) = plt.subplots(
        3,
        1,
        figsize=(max(6, 0.09 * len(clients) + 3), 5.2),
        sharex=True,
        gridspec_kw={"height_ratios": [6, 0.6, 0.6]},
    )
    bottom = np.zeros(len(clients))
    cmap = plt.get_cmap("tab10" if C <= 10 else "tab20")
    for y in range(C):
        ax.bar(
            range(len(clients)),
            hist[:, y],
            bottom=bottom,
            width=0.9,
            color=cmap(y % cmap.N),
            label=str(y) if C <= 20 else None,
        )
        bottom += hist[:, y]
    ax.set_ylabel("training samples per label")
    ax.set_title(
        f"{data.name}: {len(data.clients)} clients"
        + (f" (first {max_clients} shown)" if len(data.clients) > max_clients else ""),
        fontsize=10,
    )
    if C <= 20:
        ax.legend(title="label", fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    concepts = np.array([[c.concept for c in clients]])
    ax_c.imshow(concepts, aspect="auto", cmap="Set1", vmin=0, vmax=8, interpolation="nearest")
    ax_c.set_yticks([0], ["concept"])
    styles = [c.style.label().split("/")[0] for c in clients]
    names = sorted(set(styles), key=lambda s: (s != "clean", s))
    codes = np.array([[names.index(s) for s in styles]])
    colours = style_colours(names)
    ax_s.imshow(
        codes,
        aspect="auto",
        cmap=ListedColormap(colours),
        interpolation="nearest",
        vmin=-0.5,
        vmax=len(names) - 0.5,
    )
    ax_s.set_yticks([0], ["style"])
    ax_s.set_xlabel("client")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
    ax_s.legend(
        handles,
        names,
        fontsize=6,
        ncol=min(6, len(names)),
        loc="upper center",
        bbox_to_anchor=(0.5, -1.6),
    )
    chandles = [
        plt.Rectangle((0, 0), 1, 1, color=plt.get_cmap("Set1")(k / 8))
        for k in range(len(data.concepts))
    ]
    ax_c.legend(
        chandles,
        [f"{k}: {m.name}" for k, m in enumerate(data.concepts)],
        fontsize=6,
        ncol=len(data.concepts),
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
    )
    return _save(fig, Path(path))


def plot_cluster_heatmaps(
    assignments: dict[str, tuple[list[int], list[int]]], path: str | Path, title: str = ""
) -> Path:
    """For each run: share of each concept's clients in each cluster (rows sum to 100%)."""
    n = max(1, len(assignments))
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 2.8), squeeze=False)
    for i_ax, (ax, (name, (clusters, concepts))) in enumerate(
        zip(axes[0], assignments.items(), strict=False)
    ):
        ks = sorted(set(clusters))
        cs = sorted(set(concepts))
        m = np.zeros((len(cs), len(ks)))
        for k, c in zip(clusters, concepts, strict=True):
            m[cs.index(c), ks.index(k)] += 1
        m = 100 * m / m.sum(axis=1, keepdims=True).clip(min=1)
        ax.imshow(m, cmap="Blues", vmin=0, vmax=100)
        for i in range(len(cs)):
            for j in range(len(ks)):
                ax.text(
                    j,
                    i,
                    f"{m[i, j]:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if m[i, j] > 60 else "black",
                )
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        # concept names on the first panel only, so labels never run into the next panel
        ax.set_yticks(range(len(cs)), [f"concept {c}" for c in cs] if i_ax == 0 else [])
        ax.set_xlabel("cluster")
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10, y=1.02)
    return _save(fig, Path(path))


def plot_tasks(runs: dict[str, list[dict[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Drift runs: each test task's accuracy over rounds (a panel per run, a line per task in
    the same colour in every panel), with the time steps' boundaries marked."""
    n = max(1, len(runs))
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.8), squeeze=False)
    every = sorted({k for hist in runs.values() for h in hist for k in h})
    colors = run_colors(k for k in every if k.startswith("global_acc_c"))  # a task's colour
    for ax, (name, hist) in zip(axes[0], runs.items(), strict=False):
        tasks = sorted({k for h in hist for k in h if k.startswith("global_acc_c")})
        for key in tasks:
            pts = [(h["round"], h[key]) for h in hist if key in h and not _nan(h[key])]
            if pts:
                label = key.removeprefix("global_acc_")
                ax.plot(*zip(*pts, strict=True), label=label, color=colors[key], lw=1)
        pairs = zip(hist, hist[1:], strict=False)
        starts = [b["round"] for a, b in pairs if b.get("step") != a.get("step")]
        for r in starts:  # the first evaluation of every later step
            ax.axvline(r - 0.5, color="grey", ls=":", lw=0.8)
        ax.set_xlabel("round")
        ax.set_ylim(0, 100)
        ax.set_title(f"{name}: test tasks (%)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, Path(path))


def plot_timeline(data, rounds: int, path: str | Path, max_clients: int = 120) -> Path:
    """The true concept of every client (rows) at every round (columns), coloured as in
    :func:`plot_scenario`; dashed lines at the step boundaries, a dot where a client's concept
    changes, and a strip on top with each round's feature style(s). A ``scenario.drift``
    scenario has no step lines: a triangle marks a drift onset that changes no concept (a
    rotation, a new label distribution) and a cross a round a client may not take part in."""

    full = concept_schedule(data, rounds)
    sched, styles = full[:max_clients], style_schedule(data, rounds)[:max_clients]
    K, R = sched.shape
    changes = concept_changes(sched)
    n_concepts = max(len(data.concepts), int(full.max()) + 1)
    colours = [plt.get_cmap("Set1")(k / 8) for k in range(n_concepts)]
    fig, (ax_s, ax) = plt.subplots(
        2,
        1,
        figsize=(min(16, max(6, 0.22 * R + 2.5)), min(14, max(3.2, 0.24 * K + 1.8))),
        sharex=True,
        gridspec_kw={"height_ratios": [0.35, max(3, K / 6)], "hspace": 0.06},
    )
    extent = (0.5, R + 0.5, K - 0.5, -0.5)  # column r-1 is round r, row k is client k
    ax.imshow(
        sched,
        aspect="auto",
        cmap=ListedColormap(colours),
        vmin=-0.5,
        vmax=n_concepts - 0.5,
        interpolation="nearest",
        extent=extent,
    )
    k_idx, r_idx = np.nonzero(changes)
    ax.scatter(r_idx + 1, k_idx, s=22, c="black", edgecolors="white", linewidths=0.6, zorder=3)
    events = data.step_starts is not None  # scenario.drift: onsets and availability, no steps
    if events:
        onsets = onset_schedule(data, R)[: len(sched)] & ~changes
        k_o, r_o = np.nonzero(onsets)
        ax.scatter(r_o + 1, k_o, s=26, marker="^", c="black", edgecolors="white", zorder=3)
        if data.availability is not None:
            avail = np.ones(sched.shape, dtype=bool)
            n = min(R, data.availability.shape[1])
            avail[:, :n] = data.availability[: len(sched), :n]
            avail[:, n:] = avail[:, [n - 1]]
            k_a, r_a = np.nonzero(~avail)
            ax.scatter(r_a + 1, k_a, s=12, marker="x", c="black", lw=0.8, zorder=3)
    bounds = [] if events else step_boundaries(data, rounds)
    for b in bounds:
        for a in (ax, ax_s):
            a.axvline(b - 0.5, color="black", ls="--", lw=1.0, zorder=4)
    ax.set_xlabel("round")
    ax.set_ylabel("client")
    ax.set_yticks(range(K) if K <= 40 else np.linspace(0, K - 1, 9).astype(int))
    per_round = ["+".join(sorted(set(styles[:, r]))) for r in range(R)]
    strip_names = sorted(set(per_round), key=lambda s: (s != "clean", s))
    greys = iter(np.linspace(0.25, 0.6, max(1, len(strip_names))))  # not the concepts' colours
    strip_cols = [
        (1.0, 1.0, 1.0, 1.0) if n == "clean" else plt.get_cmap("Greys")(next(greys))
        for n in strip_names
    ]
    ax_s.imshow(
        np.array([[strip_names.index(s) for s in per_round]]),
        aspect="auto",
        cmap=ListedColormap(strip_cols),
        vmin=-0.5,
        vmax=len(strip_names) - 0.5,
        interpolation="nearest",
        extent=(0.5, R + 0.5, 0.5, -0.5),
    )
    cuts = [r + 1 for r in range(1, R) if per_round[r] != per_round[r - 1]]
    starts = [1, *(cuts if events else bounds), R + 1]
    steps = round_steps(data, rounds)
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
        step = f"step {steps[lo - 1]}: " if data.steps and not events else ""
        text = step + per_round[lo - 1] if hi - lo >= min(3, R // 8 + 1) else ""
        ax_s.text((lo + hi - 1) / 2, 0, text, ha="center", va="center", fontsize=7)
    ax_s.set_yticks([0], ["style"])
    n_drift = int(changes[:, 1:].sum())
    ax_s.set_title(
        f"{data.name}: true concept per client and round — "
        + (f"data changes in {data.num_steps - 1} rounds, " if events else "")
        + (f"{data.num_steps or 1} step(s), " if not events else "")
        + f"{n_drift} concept changes"
        + (f" (first {max_clients} of {len(full)} clients)" if len(full) > max_clients else ""),
        fontsize=10,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in range(n_concepts)]
    labels = [
        f"{k}: {data.concepts[k].name}" if k < len(data.concepts) else str(k)
        for k in range(n_concepts)
    ]
    handles += [
        Line2D([], [], color="black", ls="--", lw=1.0),
        Line2D([], [], color="black", marker="o", ls="", ms=4, mec="white"),
    ]
    labels += ["step boundary", "concept change"]
    if events:
        handles = handles[:-2] + [
            handles[-1],
            Line2D([], [], color="black", marker="^", ls="", ms=5, mec="white"),
            Line2D([], [], color="black", marker="x", ls="", ms=4),
        ]
        labels = labels[:-2] + ["concept change", "other drift onset", "not available"]
    ax.legend(
        handles, labels, title="concept", fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)
    )
    return _save(fig, Path(path))


def plot_drift(
    rows: list[dict[str, Any]],
    columns: Iterable[tuple[str, str, int]],
    path: str | Path,
    title: str = "",
    colors: dict[str, Any] | None = None,
) -> Path:
    """Drift measures per method (a panel per measure, a bar per method); a measure a method
    does not have (``None``: no cluster assignments) is left out of its panel and marked n/a."""
    cols = list(columns)
    names = [r["run"] for r in rows]
    colors = colors or run_colors(names)
    fig, axes = plt.subplots(1, len(cols), figsize=(2.6 * len(cols), 3.2), squeeze=False)
    for ax, (key, label, _) in zip(axes[0], cols, strict=True):
        for i, row in enumerate(rows):
            value = row.get(key)
            if value is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(i, value, color=colors[row["run"]])
        ax.set_title(label, fontsize=9)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_drift_bench(
    rows: list[dict[str, Any]], columns: Iterable[tuple[str, str, int]], path: str | Path, title=""
) -> Path:
    """The drift benchmark's measures: a panel per measure, the drift kinds along x, a bar per
    method (rows labelled ``"<method> [<kind>]"``); a missing value (None) is left out."""
    cols = list(columns)
    split = [(r["run"].rsplit(" [", 1)[0], r["run"].rsplit(" [", 1)[-1].rstrip("]")) for r in rows]
    methods = list(dict.fromkeys(m for m, _ in split))
    kinds = list(dict.fromkeys(k for _, k in split))
    colors = run_colors(methods)
    width = 0.8 / len(methods)
    fig, axes = plt.subplots(len(cols), 1, figsize=(1.1 * len(kinds) + 3, 2.2 * len(cols)))
    for ax, (key, label, _) in zip(np.atleast_1d(axes), cols, strict=True):
        for row, (m, k) in zip(rows, split, strict=True):
            if row.get(key) is not None:
                x = kinds.index(k) + (methods.index(m) - (len(methods) - 1) / 2) * width
                ax.bar(x, row[key], width, color=colors[m], label=m)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(range(len(kinds)), kinds, fontsize=8)
        ax.set_xlim(-0.5, len(kinds) - 0.5)  # every panel's kinds in the same place
        ax.tick_params(axis="y", labelsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[m]) for m in methods]
    ncol = min(len(methods), 7)
    fig.legend(
        handles, methods, loc="upper center", ncol=ncol, fontsize=8, bbox_to_anchor=(0.5, 0.985)
    )
    if title:
        fig.suptitle(title, fontsize=10, y=0.998)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _save(fig, path)
