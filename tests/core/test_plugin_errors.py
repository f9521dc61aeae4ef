"""A broken plugin is one line naming its file, line and error (exit 2), never a traceback: a
syntax error, an exception raised on import, a built-in name taken again, a folder given
where a file or module is expected."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from typer.testing import CliRunner

from fedshift import cli
from fedshift.core.errors import ConfigError
from fedshift.core.registry import Registry
from tests.conftest import tiny_config

BROKEN = {
    "syntax.py": ("x = 1\ny = 2\ndef f(:\n    pass\n", "SyntaxError at line 3: invalid syntax"),
    "raises.py": ("import os\n\nraise RuntimeError('boom')\n", "RuntimeError at line 3: boom"),
    "imports.py": (
        "x = 1\nimport no_such_module_here\n",
        "ModuleNotFoundError at line 2: No module named 'no_such_module_here'",
    ),
}

TAKES_FEDAVG = textwrap.dedent(
    """
    import fedshift
    from fedshift.algorithms.fedavg import FedAvg


    @fedshift.register
    class Mine(FedAvg):
        name = "fedavg"
    """
)


def invoke(*args):
    return CliRunner().invoke(cli.app, list(args))


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_plugin_file_on_the_command_line_is_one_line(tmp_path, monkeypatch, name):
    text, expected = BROKEN[name]
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke("--plugin", name, "list"))
    assert f"plugin {tmp_path / name}: {expected}" in line


def test_a_broken_plugin_file_in_a_config_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "syntax.py").write_text(BROKEN["syntax.py"][0])
    raw = tiny_config(tmp_path, train__rounds=1)
    raw["plugins"] = ["syntax.py"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke("run", "c.yaml"))
    assert "syntax.py: SyntaxError at line 3: invalid syntax" in line


def test_a_broken_plugin_module_names_its_line(tmp_path, monkeypatch):
    (tmp_path / "brokenpkg_for_test").mkdir()
    (tmp_path / "brokenpkg_for_test" / "__init__.py").write_text("a = 1\nraise KeyError('k')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = one_error_line(invoke("--plugin", "brokenpkg_for_test", "list"))
    assert "plugin brokenpkg_for_test: KeyError at line 2: 'k'" in line


def test_a_plugin_taking_a_built_in_name_says_to_choose_another(tmp_path):
    (tmp_path / "mine.py").write_text(TAKES_FEDAVG)
    line = one_error_line(invoke("--plugin", str(tmp_path / "mine.py"), "list"))
    assert "mine.py" in line and "'fedavg'" in line and "another name" in line


def test_a_name_a_plugin_took_before_the_built_in_ones_loaded_is_one_error():
    """A plugin registering a model or dataset before the built-in ones are imported: the
    built-in registration that collides names the name, the plugin and the fix."""

    reg: Registry[int] = Registry("widget", loader=lambda: reg.add("gear", 1))
    reg.add("gear", 2)  # a plugin's, before any lookup loaded the built-in entries
    with pytest.raises(ConfigError, match="widget 'gear' is one of fedshift's own.*another name"):
        reg.names()


@pytest.mark.parametrize("given", ["adir", "adir/", "./adir"])
def test_a_directory_given_as_a_plugin_says_so(tmp_path, monkeypatch, given):
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a bare folder imports as a namespace package
    line = one_error_line(invoke("--plugin", given, "list"))
    assert "is a directory" in line and ".py file" in line and "not found" not in line
