"""The catalogue of named things (``fedshift list``): algorithms with their premise and paper,
datasets, models, corruptions and pools."""

from __future__ import annotations

from rich.markup import escape

from fedshift.algorithms import algorithm_names, get_algorithm
from fedshift.algorithms.premise import premise
from fedshift.data.features import CORRUPTION_POOLS, corruption_names
from fedshift.data.sources import dataset_names
from fedshift.models import model_names


def algorithm_lines() -> list[str]:
    """One line per registered algorithm: its name, its premise (what it claims to be good at,
    :func:`fedshift.testing.premise`) and its paper."""

    out = []
    for name in algorithm_names():
        cls = get_algorithm(name)
        out.append(f"  {name:<15} {premise(cls):<13} {escape(cls.paper or '(no paper given)')}")
    return out


def algorithm_markdown() -> str:
    """The table of algorithms in docs/algorithms.md: name, premise and paper (``fedshift
    list --markdown``; a test keeps the page's copy equal to it)."""
    lines = ["| name | premise | paper |", "|---|---|---|"]
    for name in algorithm_names():
        cls = get_algorithm(name)
        lines.append(f"| `{name}` | {premise(cls)} | {cls.paper.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def catalogue() -> list[str]:
    """One line per kind of named thing: algorithms, datasets, models, corruptions, pools."""
    lines = [f"[bold]algorithms[/bold] ({len(algorithm_names())}): name, premise, paper"]
    lines += algorithm_lines()
    lines += [
        f"[bold]{title}[/bold]: {', '.join(names)}"
        for title, names in (
            ("datasets", dataset_names()),
            ("models", model_names()),
            ("corruptions", corruption_names()),
        )
    ]
    lines += [
        f"[bold]corruption pool {pool}[/bold] ({len(members)}): {', '.join(members)}"
        for pool, members in CORRUPTION_POOLS.items()
    ]
    return lines
