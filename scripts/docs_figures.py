"""Regenerate the figures of the documentation (docs/img/) with fedshift itself.

    FEDSHIFT_DATA=path/to/data .venv/bin/python scripts/docs_figures.py

Each scenario figure is what ``fedshift scenario CONFIG --out docs/img/NAME.png`` draws
(``fedshift.reporting.plots.plot_scenario``: training samples per label for every client, with strips for
its concept and feature style); the command is printed beside each file and quoted on the
page that shows it (docs/scenarios.md). Three kinds of figure go beyond that command and are
drawn here from the scenario it builds: one panel per time step of a drift scenario, the
test-only clients of a scenario, and a few training images of some clients (what a feature
style or an attribute does to the inputs). Fashion-MNIST, MNIST, USPS and MNIST-M must be in
the data folder. Takes under a minute on a CPU.
"""

from __future__ import annotations

import contextlib
import copy
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"

# (figure, config, overrides): drawn by `fedshift scenario CONFIG OVERRIDES --out IMG/figure.png`
SCENARIOS = [
    ("label-dirichlet", "configs/examples/label_dirichlet.yaml", []),
    ("label-pathological", "configs/examples/label_pathological.yaml", []),
    ("quantity-skew", "configs/examples/quantity_skew.yaml", []),
    ("feature-corruptions", "configs/examples/feature_corruptions.yaml", []),
    ("concept-permutations", "configs/examples/concept_permutations.yaml", []),
    ("fedrc-mix", "configs/examples/fedrc_mix_fmnist.yaml", []),
    ("attribute-colored-mnist", "configs/examples/attribute_colored_mnist.yaml", []),
]
# (figure, config, clients shown, images per client): a few training images per client
# ("styled": two clean clients, then the first six with a feature style)
SAMPLES = [
    ("feature-corruptions-samples", "configs/examples/feature_corruptions.yaml", "styled", 6),
    ("feature-rotation-color-samples", "configs/examples/feature_rotation_color.yaml", range(8), 6),
    (
        "attribute-colored-mnist-samples",
        "configs/examples/attribute_colored_mnist.yaml",
        range(0, 20, 3),
        6,
    ),
    ("digit-domains-samples", "configs/examples/digit_domains.yaml", range(3), 8),
]
DRIFT = ("drift-step", "configs/examples/drift_switch.yaml")
TEST_ONLY = ("test-only-clients", "configs/examples/fedrc_mix_fmnist.yaml")


def scenario_command(name: str, config: str, overrides: list[str]) -> list[str]:
    return ["scenario", config, *overrides, "--out", str(IMG.relative_to(ROOT) / f"{name}.png")]


def run_cli(args: list[str]) -> None:
    from fedshift.cli import app

    with contextlib.redirect_stdout(io.StringIO()):
        try:
            app(args=args, prog_name="fedshift", standalone_mode=False)
        except SystemExit as e:
            if e.code:
                raise RuntimeError(f"fedshift {' '.join(args)} exited with {e.code}") from None


def build(config: str):
    import fedshift

    cfg = fedshift.load_config(ROOT / config)
    return fedshift.build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)


def show(path: Path, how: str) -> None:
    print(f"{path.relative_to(ROOT)}  ({path.stat().st_size // 1024} KB)  <- {how}")


def drift_steps(prefix: str, config: str) -> None:
    """One plot_scenario panel per time step: the clients' labels and concepts at that step."""
    from fedshift.reporting.plots import plot_scenario

    data = build(config)
    for t, clients in enumerate(data.steps, start=1):
        view = copy.copy(data)
        view.clients = clients
        view.name = f"{data.name}, time step {t}"
        path = plot_scenario(view, IMG / f"{prefix}{t}.png")
        show(path, f"plot_scenario of time step {t} of {config}")
    from fedshift.config import load_config
    from fedshift.reporting.plots import plot_timeline

    rounds = load_config(ROOT / config).train.rounds
    path = plot_timeline(data, rounds, IMG / "drift-timeline.png")
    show(path, f"the timeline.png of fedshift scenario {config}")


def drift_kinds(config: str) -> None:
    """The timeline.png of a scenario.drift scenario with every drift kind."""
    from fedshift.config import load_config
    from fedshift.reporting.plots import plot_timeline

    data = build(config)
    rounds = load_config(ROOT / config).train.rounds
    path = plot_timeline(data, rounds, IMG / "drift-kinds-timeline.png")
    show(path, f"the timeline.png of fedshift scenario {config}")


def test_only(name: str, config: str) -> None:
    """plot_scenario of the scenario's test-only clients instead of its training clients."""
    from fedshift.reporting.plots import plot_scenario

    data = build(config)
    view = copy.copy(data)
    view.clients = data.test_clients
    view.name = f"{data.name}, test-only clients"
    show(
        plot_scenario(view, IMG / f"{name}.png"),
        f"plot_scenario of the test-only clients of {config}",
    )


def samples(name: str, config: str, which, per_client: int) -> None:
    """A row of training images per client, titled with its feature style and concept."""
    data = build(config)
    if which == "styled":
        clean = [c for c in data.clients if c.style.kind == "clean"][:2]
        clients = clean + [c for c in data.clients if c.style.kind != "clean"][:6]
    else:
        clients = [data.clients[i] for i in which if i < len(data.clients)]
    fig, axes = plt.subplots(
        len(clients),
        per_client,
        figsize=(0.55 * per_client + 1.3, 0.62 * len(clients) + 0.3),
        squeeze=False,
    )
    for row, client in zip(axes, clients, strict=True):
        idx = client.train_idx[:per_client]
        for j, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
            if j >= len(idx):
                continue
            img = data.x[idx[j]].numpy().transpose(1, 2, 0)
            ax.imshow(
                img[..., 0] if img.shape[-1] == 1 else img,
                cmap="gray",
                vmin=0,
                vmax=255,
                interpolation="nearest",
            )
            ax.set_title(str(int(client.y_train[j])), fontsize=6, pad=1)
        row[0].set_ylabel(
            f"client {client.cid}\n{client.style.label()}",
            fontsize=6,
            rotation=0,
            ha="right",
            va="center",
        )
    fig.suptitle(f"{data.name}: training images (label above each)", fontsize=8, y=1.0)
    fig.subplots_adjust(wspace=0.05, hspace=0.35)
    path = IMG / f"{name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    show(path, f"training images of {config}")


def main() -> int:
    IMG.mkdir(parents=True, exist_ok=True)
    for name, config, overrides in SCENARIOS:
        args = scenario_command(name, config, overrides)
        run_cli(args)
        show(IMG / f"{name}.png", "fedshift " + " ".join(args))
    drift_steps(*DRIFT)
    drift_kinds("configs/drift/all_kinds.yaml")
    test_only(*TEST_ONLY)
    for spec in SAMPLES:
        samples(*spec)
    too_big = [p.name for p in IMG.glob("*.png") if p.stat().st_size > 300_000]
    if too_big:
        print(f"over 300 KB: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
