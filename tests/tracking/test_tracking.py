"""Tracking sinks (``log: [tensorboard, wandb, mlflow]``): each gets exactly the evaluations of
metrics.jsonl (read back through the sink's own reader), the config as hyper-parameters and
the figures; a resumed run continues the same tracked runs with every step once; the runs of
a sweep or a reproduction share a group; mistakes are one-line errors; importing fedshift loads
none of the sinks' packages."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedshift.algorithms.registry import experiment
from fedshift.cli import app
from fedshift.config import validate_config
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.run.experiment import run_experiment
from tests.conftest import require_extra, tiny_config


@pytest.fixture(autouse=True)
def _quiet_offline_wandb(tmp_path, monkeypatch):
    """W&B offline, silent, its settings and caches in the test's folder (no login, no network)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))


def expected_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as tag -> {round: value}: every numeric value but the round (null: NaN)."""
    out: dict[str, dict[int, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key != "round" and (value is None or isinstance(value, int | float)):
                out.setdefault(key, {})[row["round"]] = math.nan if value is None else value
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-6)


def tensorboard_events(run_dir: Path):
    require_extra("tensorboard", "tracking")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def tensorboard_hparams(acc) -> dict[str, object]:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (``run-<id>.wandb``): a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks (4-byte checksum, 2-byte length, 1-byte type:
    1 whole, 2 first, 3 middle, 4 last) hold protobuf ``Record`` s."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", []
    assert raw[:4] == b":W&B", raw[:7]
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, size, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        buf += raw[pos + 7 : pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def wandb_history(run_dir: Path, run_id: str) -> tuple[list, dict, list[dict[str, object]]]:
    """Of every offline W&B folder of the run, oldest first: the run records, the config and
    the logged rows (key -> value, ``_step`` included)."""
    files = sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb"))
    assert files, sorted(p.name for p in (run_dir / "wandb").iterdir())
    runs, config, rows = [], {}, []
    for f in files:
        for r in wandb_records(f):
            if r.HasField("run"):
                runs.append(r.run)
                config.update({u.key: json.loads(u.value_json) for u in r.run.config.update})
            elif r.HasField("config"):
                config.update({u.key: json.loads(u.value_json) for u in r.config.update})
            elif r.HasField("history"):
                items = r.history.item
                rows.append(
                    {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}
                )
    return runs, config, rows


def mlflow_run(run_dir: Path):
    require_extra("mlflow", "tracking")
    from mlflow.tracking import MlflowClient

    entry = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=entry["uri"])
    return client, entry["run_id"]


class Interrupt:
    """A callback that presses Ctrl-C at the end of a round."""

    def __init__(self, after: int) -> None:
        self.after = after

    def on_start(self, sim, state) -> None:
        pass

    def on_round_end(self, sim, state, metrics) -> None:
        if state.round == self.after:
            raise KeyboardInterrupt

    def on_end(self, sim, state) -> None:
        pass


# ----------------------------------------------------------------------------- sinks


def test_tensorboard_and_offline_wandb_hold_the_records_of_metrics_jsonl(tmp_path):
    require_extra("wandb", "tracking")
    raw = tiny_config(tmp_path, log=["tensorboard", "wandb"], tracking={"group": "g1"})
    raw["output"]["plots"] = True
    res = run_experiment(validate_config(raw))
    want = expected_scalars(res.run_dir)
    assert "global_acc" in want and "train_s" in want

    acc = tensorboard_events(res.run_dir)
    assert sorted(acc.Tags()["scalars"]) == sorted(want)
    for tag, by_round in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [1, 2, 3], tag
        assert all(same(v, by_round[s]) for s, v in got), (tag, got, by_round)
    assert tensorboard_hparams(acc)["train.lr"] == pytest.approx(0.05)
    assert [e.step for e in acc.Images("plots/curves")] == [3]

    run_id = json.loads((res.run_dir / "tracking.json").read_text())["wandb"]["id"]
    runs, config, rows = wandb_history(res.run_dir, run_id)
    assert [(r.run_id, r.run_group, r.display_name) for r in runs] == [(run_id, "g1", "tiny")]
    assert config["train.lr"] == 0.05 and config["log"] == '["tensorboard", "wandb"]'
    logged = [r for r in rows if "global_acc" in r]
    assert [r["_step"] for r in logged] == [1, 2, 3]
    for row in logged:
        assert all(same(row[k], want[k][row["_step"]]) for k in want), row
    assert [r["_step"] for r in rows if r.get("plots/curves/_type") == "image-file"] == [3]


def test_mlflow_holds_metrics_params_and_summary(tmp_path):
    require_extra("mlflow", "tracking")
    res = run_experiment(validate_config(tiny_config(tmp_path, log="mlflow")))
    client, run_id = mlflow_run(res.run_dir)
    assert (tmp_path / "runs" / "mlflow.db").is_file()  # the store beside the run directories
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    assert client.get_experiment(run.info.experiment_id).name == "fedshift"
    assert run.data.params["train.lr"] == "0.05" and run.data.params["seed"] == "0"
    want = expected_scalars(res.run_dir)
    for key, by_round in want.items():
        got = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        assert [s for s, _ in got] == [1, 2, 3], key
        assert all(same(v, by_round[s]) for s, v in got), key
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert run.data.metrics["summary/protocols/last/global_acc"] == pytest.approx(
        summary["protocols"]["last"]["global_acc"]
    )
    assert run.data.tags["fedshift.status"] == "finished"
    assert "summary.json" in [f.path for f in client.list_artifacts(run_id)]


def test_nested_values_are_joined_with_a_slash_and_configs_with_dots():
    from fedshift.tracking.common import hyperparameters, scalars

    record = {"round": 4, "acc": 50, "step_info": {"drift": {"score": 0.5}, "detected": True}}
    record |= {"clusters": [0, 1], "note": "text", "loss": math.nan}
    got = scalars(record)
    assert set(got) == {"acc", "step_info/drift/score", "step_info/detected", "loss"}
    assert got["step_info/drift/score"] == 0.5 and got["step_info/detected"] == 1.0
    config = {"train": {"lr": 0.1, "server_optimizer": None}, "log": ["wandb"], "seed": 3}
    assert hyperparameters(config) == {
        "train.lr": 0.1,
        "train.server_optimizer": "null",
        "log": '["wandb"]',
        "seed": 3,
    }


# ----------------------------------------------------------------------------- resume


def test_a_resumed_run_continues_its_tracked_runs_with_every_step_once(tmp_path):
    """Interrupted after round 3 with its checkpoint at round 2, resumed to round 5: the same
    W&B and MLflow runs, TensorBoard's steps 1..5 once each with metrics.jsonl's values."""
    require_extra("wandb", "tracking")
    raw = tiny_config(tmp_path, log=["tensorboard", "wandb", "mlflow"], train__rounds=5)
    raw["output"]["checkpoint_every"] = 2
    cfg = validate_config(raw)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, callbacks=[Interrupt(after=3)])
    run_dir = tmp_path / "runs" / "tiny"
    before = json.loads((run_dir / "tracking.json").read_text())
    assert {k: v["logged_through"] for k, v in before.items()} == dict.fromkeys(before, 3)
    client, run_id = mlflow_run(run_dir)
    assert client.get_run(run_id).info.status == "KILLED"

    res = run_experiment(cfg, resume=True)
    after = json.loads((run_dir / "tracking.json").read_text())
    assert after["wandb"]["id"] == before["wandb"]["id"]
    assert after["mlflow"]["run_id"] == before["mlflow"]["run_id"]
    assert [h["round"] for h in res.history] == [1, 2, 3, 4, 5]

    acc = tensorboard_events(run_dir)
    want = expected_scalars(run_dir)
    for tag, by_round in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [1, 2, 3, 4, 5], (tag, got)
        assert all(same(v, by_round[s]) for s, v in got), (tag, got, by_round)

    runs, _, rows = wandb_history(run_dir, after["wandb"]["id"])
    assert len(runs) == 2 and {r.run_id for r in runs} == {after["wandb"]["id"]}
    assert [r["_step"] for r in rows if "global_acc" in r] == [1, 2, 3, 4, 5]

    assert client.get_run(run_id).info.status == "FINISHED"
    for key in ("global_acc", "train_s"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2, 3, 4, 5]


def test_a_run_started_over_replaces_its_tracked_runs(tmp_path):
    raw = tiny_config(tmp_path, log=["tensorboard"], train__rounds=2)
    cfg = validate_config(raw)
    run_experiment(cfg)
    run_experiment(cfg, overwrite=True)
    acc = tensorboard_events(tmp_path / "runs" / "tiny")
    assert [e.step for e in acc.Scalars("global_acc")] == [1, 2]
    assert len(list((tmp_path / "runs" / "tiny" / "tensorboard").iterdir())) == 1


# ----------------------------------------------------------------------------- groups


def test_the_runs_of_a_sweep_share_a_group(tmp_path):
    from fedshift.studies.sweep import parse_grid, plan_sweep, run_sweep

    require_extra("mlflow", "tracking")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, train__rounds=1)))
    grid = parse_grid(["train.lr=0.05,0.1", "log=tensorboard,mlflow"])  # sinks: not an axis
    assert grid.keys == ["train.lr"] and grid.fixed == ("log=[tensorboard,mlflow]",)
    with pytest.raises(ConfigError, match="tracking.group: cannot be an axis"):
        parse_grid(["tracking.group=a,b"])
    plan = plan_sweep(path, grid)
    assert [j.cfg.tracking.group for j in plan.jobs] == ["tiny-sweep", "tiny-sweep"]
    run_sweep(plan)
    client, run_id = mlflow_run(plan.out_dir / plan.jobs[0].cfg.name)
    experiment = client.get_experiment_by_name("tiny-sweep")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["lr=0.05/seed0", "lr=0.1/seed0"]
    assert {r.data.tags["fedshift.group"] for r in runs} == {"tiny-sweep"}
    acc = tensorboard_events(plan.out_dir / "lr=0.1" / "seed0")
    assert "fedshift/group/text_summary" in acc.Tags()["tensors"]


def test_the_runs_of_a_reproduction_share_a_group_unless_the_config_names_one(tmp_path):
    from fedshift.studies.papers import PaperTable, Variant
    from fedshift.studies.reproduce import plan_table

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    spec = PaperTable(
        key="tiny-table",
        title="a tiny table",
        protocol="last",
        configs={"tiny": str(path)},
        variants=(Variant("FedAvg", "fedavg"), Variant("Local", "local")),
        metrics=(("global_acc", "acc %"),),
        paper={},
    )
    base = validate_config(tiny_config(tmp_path))
    assert {j.cfg.tracking.group for j in plan_table(spec, "tiny", base)} == {"tiny-table-tiny"}
    own = validate_config(tiny_config(tmp_path, tracking={"group": "mine"}))
    assert {j.cfg.tracking.group for j in plan_table(spec, "tiny", own)} == {"mine"}


# ----------------------------------------------------------------------------- mistakes


def test_an_unknown_sink_is_a_config_error_naming_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate_config(tiny_config(tmp_path, log=["tensorbord"]))
    assert str(err.value) == (
        "config: log: unknown sink 'tensorbord' (did you mean 'tensorboard'?); "
        "allowed: tensorboard, wandb, mlflow"
    )
    with pytest.raises(ConfigError, match="tracking.mode"):
        validate_config(tiny_config(tmp_path, tracking={"mode": "cloud"}))
    with pytest.raises(ConfigError, match="tracking.projcet: unknown key"):
        validate_config(tiny_config(tmp_path, tracking={"projcet": "x"}))
    cfg = validate_config(tiny_config(tmp_path, log="wandb, tensorboard,wandb"))
    assert cfg.log == ["wandb", "tensorboard"]
    other = validate_config(tiny_config(tmp_path, log=[], tracking={"group": "x"}))
    assert experiment(other) == experiment(cfg)  # where results go, not what is computed


def test_cli_mistakes_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    res = CliRunner().invoke(app, ["run", str(path), "--log", "tensorboard,wandbb"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert "unknown sink 'wandbb' (did you mean 'wandb'?)" in res.stderr
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    res = CliRunner().invoke(app, ["run", str(path), "--log", "wandb"])
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert 'pip install "fedshift[tracking]"' in res.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was created
    with pytest.raises(FedshiftError, match="wandb package"):
        run_experiment(validate_config(tiny_config(tmp_path, log=["wandb"])))


def test_the_log_option_of_run_turns_a_sink_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, train__rounds=1)))
    res = CliRunner().invoke(app, ["run", str(path), "--log", "tensorboard"])
    assert res.exit_code == 0, res.stderr
    assert list((tmp_path / "runs" / "tiny" / "tensorboard").glob("events.out.tfevents.*"))


def test_importing_fedshift_loads_no_sink_package():
    code = (
        "import sys; import fedshift, fedshift.config, fedshift.run.experiment, fedshift.tracking\n"
        "from typer.testing import CliRunner; from fedshift.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['run', '--help']).exit_code == 0\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_the_runs_of_a_comparison_share_a_group(tmp_path):
    from fedshift.studies.compare import algorithm_configs

    base = validate_config(tiny_config(tmp_path, log=["tensorboard"]))
    cfgs = algorithm_configs(base, ["fedavg", "local"])
    assert {c.tracking.group for c in cfgs.values()} == {"tiny"}
    own = validate_config(tiny_config(tmp_path, tracking={"group": "mine"}))
    assert {c.tracking.group for c in algorithm_configs(own, ["fedavg"]).values()} == {"mine"}
