"""A node's data folder that cannot be used (issue 40): ``fedshift deploy node`` says, on one
line and before Flower starts, which file is wrong, what is wrong with it and how to fix it;
the ClientApp's loading of the same files for a job (:func:`~fedshift.flower.deploy.node.runtime`)
goes through the same checks. Nothing here starts a Flower process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedshift.config import dump_config, validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.client_folders import export_clients
from fedshift.data.scenario import build_scenario
from tests.conftest import require_extra, tiny_config

require_extra("flwr", "flower")  # the node's code sends Flower records

from fedshift.flower.deploy.node import NodeSettings, describe, node_clients, runtime  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """One exported client folder (synthetic features: x is [n, 16] float32)."""
    root = tmp_path_factory.mktemp("export")
    cfg = validate_config(tiny_config(root, scenario__num_clients=4))
    export_clients(build_scenario(cfg.scenario, cfg.seed, None), root / "clients")
    return root / "clients" / "client_0"


def _arrays(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(folder / "train.npz") as z:
        return z["x"], z["y"]


def _corrupt(folder: Path) -> None:
    (folder / "train.npz").write_bytes(np.random.default_rng(0).bytes(2000))


def _empty(folder: Path) -> None:
    (folder / "train.npz").write_bytes(b"")


def _objects(folder: Path) -> None:
    x, y = _arrays(folder)
    np.savez(folder / "train.npz", x=np.array([x[0], x[1][:3]], dtype=object), y=y[:2])


def _narrow(folder: Path) -> None:
    x, y = _arrays(folder)
    np.savez(folder / "train.npz", x=x[:, :10], y=y)


def _images(folder: Path) -> None:  # images where client.json declares 16 features
    x, y = _arrays(folder)
    np.savez(folder / "train.npz", x=np.zeros((len(x), 8, 8, 1), np.uint8), y=y)


def _short_labels(folder: Path) -> None:
    x, y = _arrays(folder)
    np.savez(folder / "train.npz", x=x, y=y[:-5])


def _string_cid(folder: Path) -> None:
    meta = json.loads((folder / "client.json").read_text())
    (folder / "client.json").write_text(json.dumps({**meta, "cid": "abc"}))


CASES = {  # what is done to the folder, the file named, words of the line
    "corrupt": (_corrupt, "train.npz", "is not an npz archive"),
    "empty": (_empty, "train.npz", "is empty"),
    "object_dtype": (_objects, "train.npz", "holds Python objects"),
    "mis_shaped": (_narrow, "train.npz", "inputs of shape [10]"),
    "images_for_features": (_images, "train.npz", "inputs of shape [1, 8, 8]"),
    "labels_of_other_length": (_short_labels, "train.npz", "270 inputs but 265 labels"),
    "string_cid": (_string_cid, "client.json", "cid 'abc' is not a client id"),
}


@pytest.fixture(params=sorted(CASES))
def broken(request, exported, tmp_path) -> tuple[Path, str, str]:
    """(a broken copy of the exported folder, the file named, words of the error)."""
    change, name, words = CASES[request.param]
    folder = tmp_path / "node"
    shutil.copytree(exported, folder)
    change(folder)
    node_clients.cache_clear()
    return folder, name, words


def test_deploy_node_names_the_broken_file_on_one_line(cli, broken):
    folder, name, words = broken
    line = cli(
        "deploy", "node", "--data", folder, "--insecure", "--superlink", "127.0.0.1:1"
    ).error()
    assert f"{folder / name}: " in line and words in line, line
    assert "re-make the folder with `fedshift export" in line, line


def test_the_node_loads_a_jobs_data_through_the_same_checks(broken, tmp_path):
    """The ClientApp's describe (handshake) and runtime (a job's data) refuse the folder with
    the line the command prints."""
    folder, name, words = broken
    settings = NodeSettings(str(folder))
    with pytest.raises(FedshiftError) as at_start:
        describe(settings)
    config = dump_config(validate_config(tiny_config(tmp_path, scenario__num_clients=4)))
    with pytest.raises(FedshiftError) as for_a_job:
        runtime(config, settings, "0123abcd")
    assert str(at_start.value) == str(for_a_job.value)
    assert f"{folder / name}: " in str(for_a_job.value) and words in str(for_a_job.value)
