"""The optional extras' guard (:func:`tests.conftest.require_extra`): a test module that needs
Ray or Flower fails on CI when the extra is missing and skips elsewhere, both with a message
that names the extra to install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require_extra


def test_a_present_module_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_extra("json", "none") is sys.modules["json"]


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_a_missing_extra_fails_on_ci(monkeypatch, ci):
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    monkeypatch.setenv("CI", ci)
    missing = r"flwr is missing.*pip install -e '\.\[flower\]' \(on CI every test must run\)"
    with pytest.raises(pytest.fail.Exception, match=missing):
        require_extra("flwr", "flower")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_extra_skips_off_ci(monkeypatch, ci):
    monkeypatch.setitem(sys.modules, "ray", None)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"ray is missing.*pip install -e '\.\[ray\]'"):
        require_extra("ray", "ray")


#: pytest on the two modules in a fresh interpreter where ``import ray`` / ``import flwr`` fail
HIDDEN = (
    "import sys, pytest; sys.modules['ray'] = sys.modules['flwr'] = None; "
    "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', "
    "'tests/engine/test_ray.py', 'tests/flower/test_flower.py']))"
)


@pytest.mark.parametrize("ci", [True, False], ids=["ci", "local"])
def test_the_ray_and_flower_modules_without_their_extras(ci):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    out = subprocess.run(
        [sys.executable, "-c", HIDDEN], cwd=ROOT, env=env, capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    halted = "(import of {0} halted; None in sys.modules): pip install -e '.[{1}]'"
    for module, extra in (("ray", "ray"), ("flwr", "flower")):
        assert f"{module} is missing {halted.format(module, extra)}" in text, text[-3000:]
    if ci:  # each module is a collection error: the run fails
        assert out.returncode == pytest.ExitCode.INTERRUPTED, text[-3000:]
        assert "2 errors" in text and "skipped" not in text, text[-3000:]
    else:  # each module is skipped (so no test is left), with the same message
        assert out.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, text[-3000:]
        assert "2 skipped" in text and "error" not in text.lower(), text[-3000:]
