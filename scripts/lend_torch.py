"""Lends this environment's torch and torchvision, with everything they require, to another
virtual environment: links to their files in one folder, which a ``.pth`` file puts on the
other environment's path (pip then counts them as installed). The wheel check uses it so that
its clean environment installs fedshift's other dependencies from the wheel's metadata without
copying about 4 GB of torch and its CUDA libraries again.

    python scripts/lend_torch.py LINK_FOLDER TARGET_SITE_PACKAGES
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

LENT = ("torch", "torchvision")


def _needed(dist: md.Distribution, extras: set[str]) -> list[tuple[str, set[str]]]:
    """(name, extras) of each requirement of ``dist`` that holds on this machine, with the
    ``extras`` it was asked for (torch needs ``cuda-toolkit[cublas, ...]``)."""
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append((req.name, set(req.extras)))
    return out


def closure(names: tuple[str, ...]) -> list[md.Distribution]:
    """The installed distributions ``names`` need, themselves included (each once)."""
    seen: dict[str, md.Distribution] = {}
    asked: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [(n, set()) for n in names]
    while todo:
        name, extras = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen and extras <= asked[key]:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement of another platform
        seen[key], asked[key] = dist, asked.get(key, set()) | extras
        todo += _needed(dist, asked[key])
    return list(seen.values())


def main(links: Path, target: Path) -> int:
    links.mkdir(parents=True, exist_ok=True)
    dists = closure(LENT)
    for dist in dists:
        root = Path(dist.locate_file(""))
        # each top-level entry of the distribution's files (not its scripts outside the folder)
        tops = {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] != ".."}
        for top in sorted(tops):
            if (root / top).exists() and not (links / top).exists():
                (links / top).symlink_to(root / top)
    (target / "_fedshift_lent_torch.pth").write_text(f"{links}\n")
    names = ", ".join(sorted(d.metadata["Name"] for d in dists))
    print(f"wheel check: lent from the test environment (linked): {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
