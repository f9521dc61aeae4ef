"""The layers of fedshift, bottom to top, written once: a module may import its own layer and
the layers below it, never one above, and no import circle anywhere. ``tests/test_layers.py``
checks the whole package against this table and ``docs/layout.md`` shows it
(``python -m fedshift.core.layers`` prints the table the page carries).

Imports inside functions (lazy imports) are allowed only where they keep an optional extra
(Ray, Flower, the tracking services, Hugging Face datasets) from loading, and in the command
line and the package's entry point, which load the library on first use so that
``fedshift --help`` and ``import fedshift`` stay light.
"""

from __future__ import annotations

#: (layer, its packages, what it holds), bottom first
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("core", ("fedshift.core",), "errors, the registry helper, plugins, seeds, atomic files"),
    ("config", ("fedshift.config",), "every schema of a run, overrides and grids"),
    ("data, models", ("fedshift.data", "fedshift.models"), "scenarios and networks"),
    ("algorithms", ("fedshift.algorithms",), "the contract and one module per algorithm"),
    ("engine", ("fedshift.engine",), "the round loop, executors, client store, memory plan"),
    ("reporting", ("fedshift.reporting",), "round protocols, tables, plots, drift measures"),
    ("tracking", ("fedshift.tracking",), "TensorBoard, W&B and MLflow sinks"),
    ("run", ("fedshift.run",), "one run: build, folder, lock, supervision"),
    ("studies", ("fedshift.studies",), "many runs: jobs, compare, tune, sweep, paper tables"),
    ("flower", ("fedshift.flower",), "the Flower adapter and a real deployment"),
    ("tools", ("fedshift.tools", "fedshift.testing"), "benchmarks, probes, provenance, checks"),
    ("cli", ("fedshift.cli",), "the fedshift command"),
    ("api", ("fedshift",), "the Python API (fedshift/__init__.py), loaded on first use"),
)

#: where a lazy import of fedshift is allowed (the importing module's package)
LAZY_IMPORTERS = ("fedshift.cli", "fedshift")


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a ``fedshift`` module (its longest package prefix)."""
    best, depth = -1, -1
    for i, (_, packages, _) in enumerate(LAYERS):
        for pkg in packages:
            if (module == pkg or module.startswith(pkg + ".")) and pkg.count(".") > depth:
                best, depth = i, pkg.count(".")
    if best < 0:
        raise KeyError(f"{module} is in no layer of fedshift.core.layers.LAYERS")
    return best


def markdown() -> str:
    """The table docs/layout.md carries, top layer first."""
    rows = ["| layer | packages | holds |", "|---|---|---|"]
    for name, packages, holds in reversed(LAYERS):
        rows.append(f"| {name} | {', '.join(f'`{p}`' for p in packages)} | {holds} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
