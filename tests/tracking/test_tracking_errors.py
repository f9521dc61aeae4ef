"""A tracking sink that cannot work is one line before the run's rounds: a TensorBoard folder
that cannot be written, a tracking server that does not answer (found in seconds, not after
the minutes of its client's retries)."""

from __future__ import annotations

import socket
import time

import pytest
import yaml
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.core.errors import FedshiftError
from fedshift.tracking.common import probe_server, probe_servers
from tests.conftest import require_extra, tiny_config


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def test_a_tracking_server_that_does_not_answer_fails_in_seconds():
    uri = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(FedshiftError, match=f"tracking server {uri} does not answer.*mlflow_uri"):
        probe_servers(["mlflow"], uri, "offline")
    assert time.monotonic() - start < 5


def test_a_server_that_answers_and_local_stores_are_let_through(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe_servers(["mlflow"], f"http://127.0.0.1:{s.getsockname()[1]}", "offline")
    for uri in (f"sqlite:///{tmp_path}/mlflow.db", f"file://{tmp_path}/mlruns", "databricks"):
        probe_servers(["mlflow"], uri, "offline")
    probe_servers(["mlflow"], None, "offline")


def test_an_online_wandb_server_is_probed_when_named(monkeypatch):
    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", uri)
    probe_servers(["wandb"], None, "offline")  # offline talks to no server
    with pytest.raises(FedshiftError, match="WANDB_BASE_URL"):
        probe_servers(["wandb"], None, "online")


def test_mlflow_at_a_closed_port_is_one_line_before_the_rounds(tmp_path, monkeypatch):
    require_extra("mlflow", "tracking")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, train__rounds=1)))
    uri = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    res = CliRunner().invoke(
        app, ["run", str(tmp_path / "c.yaml"), "--log", "mlflow", f"tracking.mlflow_uri={uri}"]
    )
    line = one_error_line(res)
    assert uri in line and "does not answer" in line
    assert time.monotonic() - start < 30


def test_a_tensorboard_folder_that_cannot_be_written_is_one_line(tmp_path):
    require_extra("torch.utils.tensorboard", "tracking")
    raw = tiny_config(tmp_path, train__rounds=1)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "runs" / "tiny"
    run_dir.mkdir(parents=True)
    (run_dir / "tensorboard").write_text("a file where the folder goes")
    res = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--log", "tensorboard"])
    line = one_error_line(res)
    assert f"tensorboard cannot write its folder {run_dir / 'tensorboard'}" in line


def test_the_probe_names_the_uri_and_the_fix():
    uri = f"https://localhost:{closed_port()}/mlflow"
    start = time.monotonic()
    with pytest.raises(FedshiftError, match=f"{uri} does not answer .*; do this"):
        probe_server(uri, "do this", timeout=1.0)
    assert time.monotonic() - start < 5
    with pytest.raises(FedshiftError, match="port"):
        probe_server("http://127.0.0.1:notaport", "do this")


def test_a_tensorboard_folder_without_write_permission_is_one_error(tmp_path, monkeypatch):
    """What a read-only run folder gives a user who is not root (root writes anyway)."""
    require_extra("torch.utils.tensorboard", "tracking")
    from fedshift.tracking import tensorboard_sink
    from fedshift.tracking.common import RunInfo

    def denied(logdir, **kwargs):
        raise PermissionError(13, "Permission denied", logdir)

    monkeypatch.setattr(tensorboard_sink, "SummaryWriter", denied)
    run = RunInfo("r", tmp_path / "r", tmp_path, "p", None, "offline", None)
    with pytest.raises(FedshiftError, match=f"folder {tmp_path / 'r' / 'tensorboard'} \\(Perm"):
        tensorboard_sink.TensorBoardSink().start(run, None, 0)
