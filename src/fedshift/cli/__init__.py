"""The ``fedshift`` command: parses arguments, calls the library, prints (see ``fedshift --help``).

User mistakes (a bad config, a missing dataset, an unknown name, an output folder that cannot
be written) print one line and exit with code 2; a run whose training diverges prints one line
(the round and a hint) and exits with code 3; an interrupted run says how to resume it and
exits with 130.
"""

from __future__ import annotations

import sys

import typer

from fedshift.cli import console as con
from fedshift.cli import results, runs, studies
from fedshift.cli.console import user_errors
from fedshift.cli.deploy import deploy_app
from fedshift.cli.options import Plugins

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="fedshift: federated learning under label, feature and concept shift.",
)


@app.callback()
def options(plugin: Plugins = None) -> None:
    """fedshift: federated learning under label, feature and concept shift."""
    user_errors(con.use_plugins)(plugin or [])


# the commands, in the order ``fedshift --help`` lists them
app.command()(runs.run)
app.command()(studies.compare)
app.command()(runs.scenario)
app.command()(studies.report)
app.command()(results.bench)
app.command()(studies.reproduce)
app.command()(studies.sweep)
app.command()(runs.flower)
app.command()(runs.export)
app.add_typer(deploy_app, name="deploy")

results_app = typer.Typer(
    help="Published results: check their numbers, re-render their tables, pack their runs."
)
results_app.command("check")(results.results_check)
results_app.command("render")(results.results_render)
results_app.command("coverage")(results.results_coverage)
results_app.command("pack")(results.results_pack)
results_app.command("unpack")(results.results_unpack)
app.add_typer(results_app, name="results")
app.command(name="list")(results.list_names)


def main() -> None:
    """Console entry point: the commands that train run in a child process the ``fedshift``
    process watches, so a run the system kills says so (:mod:`fedshift.run.supervise`)."""
    from fedshift.run.supervise import supervise, wanted

    argv = sys.argv[1:]
    if wanted(argv):
        code = supervise(argv)
        if code is not None:  # the watching parent
            sys.exit(code)
    app()


if __name__ == "__main__":
    main()
