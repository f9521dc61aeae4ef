"""Your own algorithm from your own file: a plugin file outside the repository, named in a
config (relative to the config's folder) or with ``--plugin``, runs through ``fedshift run``,
``sweep`` in worker processes, ``executor=ray`` (its file travels to the actors as text) and
an installed package's entry point; a missing plugin is a one-line error."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedshift import cli
from fedshift.algorithms.registry import ALGORITHMS
from fedshift.core import plugins
from tests.conftest import PLUGIN, registries_restored, require_extra, tiny_config

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """A folder outside the repository with the plugin and a config naming it relatively."""
    d = tmp_path_factory.mktemp("my_project")
    (d / "my_algos.py").write_text(PLUGIN.format(name="counting-avg"))
    raw = tiny_config(d, algorithm={"name": "counting-avg"}, train__rounds=2)
    raw["plugins"] = ["my_algos.py"]
    (d / "cfg.yaml").write_text(yaml.safe_dump(raw))
    return d


def invoke(*args):
    return CliRunner().invoke(cli.app, list(args))


def rounds_counted(run_dir) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["plugin_rounds"] for r in rows]


def test_a_plugin_file_named_in_the_config_runs_through_fedshift_run(plugin_dir, monkeypatch):
    monkeypatch.chdir(plugin_dir.parent)  # the file is found relative to the config
    res = invoke("run", str(plugin_dir / "cfg.yaml"), "name=plain")
    assert res.exit_code == 0, res.output
    run_dir = plugin_dir / "runs" / "plain"
    assert rounds_counted(run_dir) == [1, 2]  # the plugin's aggregate ran every round
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["plugins"] == [str(plugin_dir / "my_algos.py")]  # resolved: resume finds it
    res = invoke("run", "--resume", str(run_dir))
    assert res.exit_code == 0, res.output


def test_plugin_on_the_command_line_and_in_list(plugin_dir, tmp_path):
    (tmp_path / "cli_algos.py").write_text(PLUGIN.format(name="cli-counting-avg"))
    res = invoke("--plugin", str(tmp_path / "cli_algos.py"), "list")
    assert res.exit_code == 0 and "cli-counting-avg" in res.output
    raw = tiny_config(tmp_path, algorithm={"name": "cli-counting-avg"}, train__rounds=1)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    res = invoke("--plugin", str(tmp_path / "cli_algos.py"), "run", str(tmp_path / "c.yaml"))
    assert res.exit_code == 0, res.output
    assert rounds_counted(tmp_path / "runs" / "tiny") == [1]


def test_a_plugin_runs_in_sweep_worker_processes(plugin_dir):
    """Spawned workers never imported the file: they load it from the config they run."""
    out = plugin_dir / "sweep-out"
    res = invoke("sweep", str(plugin_dir / "cfg.yaml"), "seed=0,1", "--jobs", "2",
                 f"output.dir={out}")  # fmt: skip
    assert res.exit_code == 0, res.output
    runs = sorted(p.parent for p in out.rglob("metrics.jsonl"))
    assert len(runs) == 2 and all(rounds_counted(r) == [1, 2] for r in runs)


def test_a_node_without_the_plugin_file_runs_it_from_the_text_it_was_sent(tmp_path):
    """What a Ray node on another machine does: the driver's ``sources()`` installed in a fresh
    process where the file does not exist; a config naming the file validates there, and a
    class the driver pickled by name unpickles to the registered algorithm."""
    import pickle
    import subprocess

    f = tmp_path / "gone_algos.py"
    f.write_text(PLUGIN.format(name="gone-avg"))
    plugins.load_plugins([str(f)])
    (tmp_path / "sources.pkl").write_bytes(pickle.dumps((plugins.sources(), str(f))))
    (tmp_path / "cls.pkl").write_bytes(pickle.dumps(ALGORITHMS.get("gone-avg")))
    f.unlink()
    code = textwrap.dedent(
        f"""
        import pickle
        from pathlib import Path
        from fedshift.core import plugins
        from fedshift.algorithms.registry import ALGORITHMS
        from fedshift.config import validate_config
        from tests.conftest import tiny_config

        shipped, path = pickle.load(open({str(tmp_path / "sources.pkl")!r}, "rb"))
        plugins.install(shipped)
        cls = pickle.load(open({str(tmp_path / "cls.pkl")!r}, "rb"))
        raw = tiny_config(Path({str(tmp_path)!r}), algorithm={{"name": "gone-avg"}})
        validate_config({{**raw, "plugins": [path]}})
        print(cls is ALGORITHMS.get("gone-avg"), cls.ServerState.__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "CountingServer"]


def test_a_plugin_algorithm_runs_on_ray_actors(plugin_dir, monkeypatch):
    require_extra("ray", "ray")
    monkeypatch.chdir(plugin_dir)
    res = invoke("run", "cfg.yaml", "executor=ray", "ray.actors=2", "name=on-ray")
    assert res.exit_code == 0, res.output
    assert rounds_counted(plugin_dir / "runs" / "on-ray") == [1, 2]


def test_a_missing_plugin_is_a_one_line_error(tmp_path):
    raw = tiny_config(tmp_path)
    raw["plugins"] = ["nowhere.py"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    res = invoke("run", str(tmp_path / "c.yaml"))
    assert res.exit_code == 2 and "nowhere.py" in res.output and "not found" in res.output
    assert "Traceback" not in res.output
    res = invoke("--plugin", "no_such_module_xyz", "list")
    assert res.exit_code == 2 and "no_such_module_xyz" in res.output


def test_an_installed_package_registers_through_its_entry_point(tmp_path, monkeypatch):
    """A distribution with an entry point in ``fedshift.core.plugins`` is imported on first use."""
    site = tmp_path / "site"
    dist = site / "my_fl_pkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-fl-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fedshift.core.plugins]\nmine = my_fl_pkg_mod\n")
    (site / "my_fl_pkg_mod.py").write_text(PLUGIN.format(name="entry-point-avg"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_installed_done", False)
    assert "entry-point-avg" not in ALGORITHMS
    plugins.load_installed()
    assert "entry-point-avg" in ALGORITHMS
    sys.modules.pop("my_fl_pkg_mod", None)


#: a plugin that registers an algorithm, a model and a dataset with an alias
LEAKY = PLUGIN.format(name="leaky-avg") + textwrap.dedent(
    """
    from fedshift.data.sources import DATASETS
    from fedshift.models import MODELS

    MODELS.add("leaky-net", object())
    DATASETS.add("leaky-set", object(), "leaky-alias")
    """
)


def test_what_a_test_registers_is_undone_after_it(tmp_path):
    """The suite's guard (tests/conftest.py, around every test): a plugin loaded inside the
    block is unregistered and forgotten after it, and registers again the next time it loads."""
    from fedshift.data.sources import DATASETS
    from fedshift.models import MODELS

    f = tmp_path / "leaky_algos.py"
    f.write_text(LEAKY)
    before = {reg.kind: (reg.names(), reg.in_order()) for reg in (ALGORITHMS, DATASETS, MODELS)}
    for _ in range(2):  # the second time the file is imported (and registers) again
        with registries_restored():
            plugins.load_plugins([str(f)])
            assert "leaky-avg" in ALGORITHMS and "leaky-net" in MODELS
            assert DATASETS.canonical("leaky-alias") == "leaky-set"
        after = {reg.kind: (reg.names(), reg.in_order()) for reg in (ALGORITHMS, DATASETS, MODELS)}
        assert after == before and "leaky-alias" not in DATASETS
        assert str(f) not in [entry for entry, _, _ in plugins.sources()]
        assert not [m for m in sys.modules if m.startswith("fedshift_plugin_leaky_algos")]
