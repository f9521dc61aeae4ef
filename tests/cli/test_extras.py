"""The optional extras' guard (:func:`tests.conftest.require_extra`): a test module that needs
Ray or Flower fails when the extra is missing (never skips), with a message that names the
extra to install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require_extra


def test_a_present_module_is_returned():
    assert require_extra("json", "none") is sys.modules["json"]


@pytest.mark.parametrize("ci", [None, "true", "false"])
def test_a_missing_extra_fails_on_ci_and_off_it(monkeypatch, ci):
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    missing = r"flwr is missing.*pip install -e '\.\[flower\]' \(every test must run\)"
    with pytest.raises(pytest.fail.Exception, match=missing):
        require_extra("flwr", "flower")


#: pytest on the two modules in a fresh interpreter where ``import ray`` / ``import flwr`` fail
HIDDEN = (
    "import sys, pytest; sys.modules['ray'] = sys.modules['flwr'] = None; "
    "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', "
    "'tests/engine/test_ray.py', 'tests/flower/test_flower.py']))"
)


def test_the_ray_and_flower_modules_without_their_extras():
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # off CI too: no skip
    out = subprocess.run(
        [sys.executable, "-c", HIDDEN], cwd=ROOT, env=env, capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    halted = "(import of {0} halted; None in sys.modules): pip install -e '.[{1}]'"
    for module, extra in (("ray", "ray"), ("flwr", "flower")):
        assert f"{module} is missing {halted.format(module, extra)}" in text, text[-3000:]
    # each module is a collection error: the run fails, nothing is skipped
    assert out.returncode == pytest.ExitCode.INTERRUPTED, text[-3000:]
    assert "2 errors" in text and "skipped" not in text, text[-3000:]
