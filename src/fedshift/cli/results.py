"""Commands about published numbers and names: ``results check`` / ``render`` / ``coverage``
/ ``pack`` / ``unpack``, ``bench`` (throughput) and ``list`` (the registered names)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedshift.cli.console import console, user_errors
from fedshift.cli.options import Opt
from fedshift.core.errors import FedshiftError


def this_command(argv: list[str]) -> int | None:
    """The running ``fedshift`` command on other arguments, in this process (how ``results``
    runs a folder's render commands); its exit code."""
    import click

    root = click.get_current_context().find_root().command
    return root.main(args=argv, prog_name="fedshift", standalone_mode=False)


@user_errors
def results_check(
    root: str = Opt(".", help="the repository (benchmarks/results/, README.md and docs/)"),
) -> None:
    """Every results folder has its provenance, its tables re-render from its artifacts to the
    committed text (each differing number named at its row and column), a quoted table cell
    holds the rendered cell of its row and column, every other number of the README, the
    docs pages and the folders' notes is in an artifact, and docs/reproducing.md's coverage
    block is what its sources render to (``results coverage``)."""
    from fedshift.tools.coverage import coverage_problems
    from fedshift.tools.provenance import check_all, default_documents

    coverage = coverage_problems(Path(root))
    problems = coverage + check_all(Path(root), render_with=this_command)
    for p in problems:
        console.print(p, highlight=False, soft_wrap=True)
    if problems:
        what = f"{len(problems) - len(coverage)} published number(s) or table(s) not backed"
        raise FedshiftError(what + (f", {len(coverage)} coverage problem(s)" if coverage else ""))
    folders = [p for p in (Path(root) / "benchmarks" / "results").iterdir() if p.is_dir()]
    docs = len(default_documents(Path(root)))
    console.print(
        f"every published number is backed by an artifact, at its row and column where a"
        f" rendered table has them ({len(folders)} results folders, {docs} documents)"
    )


@user_errors
def results_coverage(
    root: str = Opt(".", help="the repository (docs/reproducing.md, benchmarks/results/)"),
    check: bool = Opt(False, help="write nothing: fail if the page's block is out of date"),
) -> None:
    """Write the reproduction coverage of the papers' tables and figures into docs/reproducing.md.

    The status of each is derived: reproduced (a results folder's provenance.yaml lists it
    under reproduces), runnable (a reproduce table or config exists) or not implemented.
    """
    from fedshift.tools.coverage import PAGE, coverage_problems, write_page

    if check:
        problems = coverage_problems(Path(root))
        for p in problems:
            console.print(p, highlight=False, soft_wrap=True)
        if problems:
            raise FedshiftError(f"{len(problems)} coverage problem(s)")
        console.print(f"{PAGE}: the coverage block is up to date")
        return
    changed = write_page(Path(root))
    console.print(f"{PAGE}: {'written' if changed else 'unchanged'}")


@user_errors
def results_render(
    folders: Annotated[list[str], typer.Argument(help="results folders")],
    root: str = Opt(".", help="the repository the render commands run in"),
) -> None:
    """Re-write a results folder's tables from its artifacts (its provenance.yaml's render)."""
    from fedshift.tools.provenance import render

    for folder in folders:
        for f in render(Path(folder), Path(root), this_command):
            console.print(f"{folder}/{f}")


@user_errors
def results_pack(
    folders: Annotated[list[str], typer.Argument(help="results folders")],
) -> None:
    """Pack a results folder's run files into its artifacts.tar.xz (the same bytes for the same files).

    All but provenance.yaml, markdown and images; the packed files are removed from the folder.
    """
    from fedshift.tools.artifacts import pack

    for folder in folders:
        path, count = pack(Path(folder))
        console.print(f"{path}: {count} files, {path.stat().st_size:,} bytes")


@user_errors
def results_unpack(
    folders: Annotated[list[str], typer.Argument(help="results folders")],
    to: str | None = Opt(None, help="unpack a copy into TO/<folder name>, leaving the folder"),
) -> None:
    """Unpack a results folder's artifacts.tar.xz to look at or change its runs.

    In place, the archive is removed until the folder is packed again (``results pack``); with
    --to, a copy is unpacked elsewhere and the folder is left as it is.
    """
    from fedshift.tools.artifacts import unpack

    for folder in folders:
        into = Path(to) / Path(folder).resolve().name if to else None
        written = unpack(Path(folder), into)
        console.print(f"{into or folder}: {len(written)} files unpacked")


@user_errors
def bench(
    device: str = Opt("auto", help="auto | cpu | cuda"),
    models: str = Opt("fmnist_cnn,resnet18", help="comma-separated: fmnist_cnn,resnet18"),
    clients: int = Opt(64, help="clients per round"),
    per_client: int = Opt(512, help="training samples per client"),
    batch_size: int = Opt(128, help="local batch size"),
    chunk_size: int = Opt(64, help="clients per batched chunk"),
    repeats: int = Opt(2, help="timed repetitions after one warm-up"),
    out: str = Opt("runs/bench/throughput.json", help="JSON results"),
    memory: str | None = Opt(None, help="also peak GPU memory for these client counts: 100,1000"),
    from_json: str | None = Opt(None, help="measure nothing: a markdown table of this JSON"),
) -> None:
    """Samples/s of plain PyTorch at a large batch (the limit), fedshift's central path, the
    sequential and the batched executor."""
    from fedshift.reporting.tables import bench_markdown_file
    from fedshift.tools.bench import run_bench

    if from_json:  # plain text, not rich: results folders re-render it to committed files
        print(bench_markdown_file(from_json))
        return
    args = (device, models, clients, per_client, batch_size, chunk_size, repeats, out, memory)
    for item in run_bench(*args, console):
        console.print(item)


@user_errors
def list_names(
    markdown: bool = Opt(
        False, help="only the algorithms, as the markdown table of docs/algorithms.md"
    ),
) -> None:
    """List the algorithms (with their papers), datasets, models, corruptions and pools."""
    from fedshift.reporting.catalogue import algorithm_markdown, catalogue

    if markdown:
        print(algorithm_markdown(), end="")
        return
    for line in catalogue():
        console.print(line)
