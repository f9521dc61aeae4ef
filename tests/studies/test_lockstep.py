"""A grid trained as one job (fedshift.engine.executors.lockstep): each run's numbers are those
of the run alone, runs that cannot share a chunk are not grouped, a diverged run leaves the
others going, and the flag turns it off."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from fedshift.config import validate_config
from fedshift.engine.executors import lockstep as lockstep_mod
from fedshift.engine.executors.stage import _stacked_sgd, _stacked_sgd_all
from fedshift.engine.training import SGDConfig
from fedshift.run.folder import RunDir
from fedshift.studies import jobs as jobs_mod
from fedshift.studies.jobs import Job, execute, lockstep_key
from tests.conftest import tiny_config

TIMING = {"train_s", "eval_s", "elapsed_s"}


class _Counted(lockstep_mod.Lockstep):
    made: list[_Counted] = []

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        _Counted.made.append(self)


@pytest.fixture
def counted(monkeypatch):
    _Counted.made = []
    monkeypatch.setattr(jobs_mod, "Lockstep", _Counted)
    return _Counted.made


def _grid(tmp_path, tag: str, algo: str, points, **over) -> list[Job]:
    jobs = []
    for i, (lr, wd, seed) in enumerate(points):
        raw = tiny_config(tmp_path / tag, algorithm__name=algo, seed=seed, name=f"r{i}", **over)
        raw["train"].update(lr=lr, weight_decay=wd, momentum=0.9, keep_momentum=True)
        jobs.append(Job(f"r{i}", validate_config(raw)))
    return jobs


def _server_tensors(job: Job) -> list[torch.Tensor]:
    state, _ = RunDir(job.cfg.output.dir + "/" + job.cfg.name).load_checkpoint(torch.device("cpu"))
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(x[k])
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(state.server)
    return out


@pytest.mark.parametrize("algo", ["fedavg", "fedrc"])
def test_a_grid_as_one_job_gives_each_run_the_numbers_of_the_run_alone(tmp_path, counted, algo):
    """Four runs (two learning rates and weight decays, two seeds: two data pools) trained
    one after another and as one job. The server models agree to 1e-5 relative: a run's rows
    go through the same kernels with the same row lengths, so only a BLAS that chose its
    blocking by the number of stacked rows could reorder a dot product's sum (float32
    rounding, about 1e-7 relative per product over a few steps; bit for bit on the machines
    measured). The accuracies agree to one point: such a rounding can only move a sample
    whose two top logits tie to rounding, at most one of the 100 or more scored samples.
    A row trained with another row's settings moves the weights by far more than 1e-5."""
    points = [(0.05, 5e-4, 0), (0.02, 1e-3, 0), (0.05, 5e-4, 1), (0.1, 1e-3, 1)]
    over = {"scenario__num_clients": 5, "train__rounds": 2, "train__local_epochs": 2}
    alone = _grid(tmp_path, "alone", algo, points, **over)
    grid = _grid(tmp_path, "grid", algo, points, **over)
    a = execute(alone, lockstep=False)
    assert counted == []
    b = execute(grid, lockstep=True)
    assert len(counted) == 1 and counted[0].stats["widest"] == 4, "the runs did not meet"
    for x, y, ja, jb in zip(a, b, alone, grid, strict=True):
        assert x.status == y.status == "finished"
        for ma, mb in zip(x.history, y.history, strict=True):
            for k in ma:
                if k in TIMING or not k.endswith("_acc"):
                    continue
                diff = abs(ma[k] - mb[k])
                assert diff <= 1.0, f"{ja.key} round {ma['round']} {k}: {ma[k]} vs {mb[k]}"
        for ta, tb in zip(_server_tensors(ja), _server_tensors(jb), strict=True):
            if torch.is_floating_point(ta):
                diff = float((ta - tb).abs().max())
                scale = float(ta.abs().max()) or 1.0
                assert diff <= 1e-5 * scale, f"{ja.key}: server weights differ by {diff:.3g}"
    # the runs really differ from each other (a row trained with another row's settings
    # would make two of them equal)
    finals = [x.history[-1]["local_acc"] for x in a]
    losses = {round(x.history[-1]["train_loss"], 6) for x in a}
    assert len(losses) == 4, (finals, losses)


def test_a_run_that_diverges_leaves_the_others_going(tmp_path, counted):
    points = [(0.05, 0.0, 0), (1e6, 0.0, 0)]
    over = {"scenario__num_clients": 4, "train__rounds": 3}
    alone = execute(_grid(tmp_path, "alone", "fedavg", points[:1], **over), lockstep=False)
    out = execute(_grid(tmp_path, "grid", "fedavg", points, **over))
    assert [o.status for o in out] == ["finished", "diverged"]
    assert out[1].diverged_round is not None
    keep = [{k: v for k, v in m.items() if k not in TIMING} for m in out[0].history]
    assert keep == [{k: v for k, v in m.items() if k not in TIMING} for m in alone[0].history]


def test_only_runs_that_can_share_a_chunk_are_grouped(tmp_path):
    def key(**over):
        return lockstep_key(validate_config(tiny_config(tmp_path, **over)))

    base = key()
    assert key(train__lr=0.3, seed=4, name="other") == base
    assert key(train__weight_decay=1e-3) == key(train__weight_decay=5e-4)
    assert key(train__momentum=0.5) == key(train__momentum=0.9)
    assert key(train__momentum=0.0) != base  # momentum on or off: another update
    assert key(train__weight_decay=0.0) != base
    assert key(train__batch_size=16) != base
    assert key(algorithm__name="fedprox") != base
    assert key(executor="sequential") is None
    assert key(log=["wandb"]) is None and key(log=["tensorboard"]) is not None


def test_the_flag_turns_it_off(tmp_path, counted, cli):
    cfg = tmp_path / "c.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, train__rounds=1)))
    args = ["sweep", str(cfg), "train.lr=0.02,0.05", f"output.dir={tmp_path / 'runs'}"]
    assert cli(*args, "--no-lockstep").code == 0
    assert counted == []
    assert cli(*args, "--fresh").code == 0  # default: on a GPU only (this config runs on cpu)
    assert counted == []
    assert cli(*args, "--fresh", "--lockstep").code == 0
    assert len(counted) == 1


def test_ctrl_c_in_one_run_stops_the_others_where_they_wait():
    """KeyboardInterrupt raised in the run that is running (Ctrl-C lands in whichever code
    runs): a run waiting at its meeting gets it too, and run() raises it once both ended."""
    hub = lockstep_mod.Lockstep()
    seen: list[str] = []

    def waits() -> None:
        try:
            hub.meet(hub.member(), [])
        except KeyboardInterrupt:
            seen.append("stopped where it waited")
            raise

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.run([waits, interrupted])
    assert seen == ["stopped where it waited"]


def test_runs_take_turns_and_meet_when_all_wait():
    """Two runs: each hands in its chunk and waits; the chunks are trained together once both
    wait (one meeting of two), and each gets its own results back."""
    trained: list[list[int]] = []

    class Trainer:
        def train_rows(self, rows):
            trained.append([r for r in rows])
            yield list(range(len(rows))), [f"result {r}" for r in rows]

    hub = lockstep_mod.Lockstep(trainer=Trainer())
    got = {}

    def run(name: str, rows: list[int]):
        def body() -> None:
            got[name] = hub.meet(hub.member(), rows)

        return body

    hub.run([run("a", [1, 2]), run("b", [3])])
    assert trained == [[1, 2, 3]]
    assert got == {"a": ["result 1", "result 2"], "b": ["result 3"]}
    assert hub.stats == {"meetings": 1, "rows": 3, "widest": 2}


@dataclass
class _Rows:
    p: list[torch.Tensor]
    g: list[torch.Tensor]
    m: list[torch.Tensor | None]


def _rows(seed: int, kept: bool) -> _Rows:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(6, 5, 3), (6, 7)]
    p = [torch.randn(s, generator=gen) for s in shapes]
    g = [torch.randn(s, generator=gen) for s in shapes]
    m = [torch.randn(s, generator=gen) if kept else None for s in shapes]
    return _Rows(p, g, m)


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_sgd_per_row_range_is_each_range_alone(kept, masked):
    """Rows 0-1, 2-4 and 5 with their own settings give, bit for bit, what each range's
    tensors give alone with its settings: the same element-wise operations on a view of the
    same length (exact by construction on any CPU)."""
    cfgs = [
        SGDConfig(0.1, 0.9, 5e-4, grad_clip=1.0),
        SGDConfig(0.03, 0.5, 1e-3, grad_clip=1.0),
        SGDConfig(0.2, 0.9, 1e-4, grad_clip=1.0),
    ]
    ranges = ((0, 2, cfgs[0]), (2, 5, cfgs[1]), (5, 6, cfgs[2]))
    act = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    whole = _rows(0, kept)
    if masked:
        _stacked_sgd(whole.p, whole.g, whole.m, act, ranges)
    else:
        _stacked_sgd_all(whole.p, whole.g, whole.m, ranges)
    for a, b, cfg in ranges:
        ref = _rows(0, kept)
        cut = [t[a:b].clone() for t in ref.p], [t[a:b].clone() for t in ref.g]
        mom = [None if t is None else t[a:b].clone() for t in ref.m]
        if masked:
            _stacked_sgd(*cut, mom, act[a:b], cfg)
        else:
            _stacked_sgd_all(*cut, mom, cfg)
        for x, y in zip(whole.p, cut[0], strict=True):
            assert torch.equal(x[a:b], y), f"rows {a}-{b}: parameters differ"
        for x, y in zip(whole.m, mom, strict=True):
            assert x is not None and y is not None and torch.equal(x[a:b], y), f"rows {a}-{b}"


def test_rows_read_their_own_pool():
    """A chunk whose rows come from two runs' data (two seeds: two pools) gathers each range
    from its own pool, crop parameters included."""
    from fedshift.data.augment import CropFlip
    from fedshift.engine.executors.stage import RowInputs, row_ranges

    pools = [torch.arange(10.0), 100 + torch.arange(10.0)]
    seen = []

    def reader(pool):
        def read(idx, crop=None):
            seen.append(None if crop is None else crop.params[:, 0].tolist())
            return pool[idx]

        return read

    fns = [reader(pools[0]), reader(pools[0]), reader(pools[1])]
    parts = row_ranges([0, 0, 1])
    assert parts == [(0, 2, 0), (2, 3, 1)]
    inputs = RowInputs(tuple((a, b, fns[a if v == 0 else 2]) for a, b, v in parts))
    gidx = torch.tensor([1, 2, 3, 4, 5, 6])  # 3 rows of batch 2
    assert inputs(gidx, 2).tolist() == [1, 2, 3, 4, 105, 106]
    crop = CropFlip(torch.arange(6).view(6, 1).repeat(1, 3), 4)
    inputs(gidx, 2, crop)
    assert seen[-2:] == [[0, 1, 2, 3], [4, 5]]


def test_the_grids_of_the_commands_are_grouped(tmp_path):
    """What each command plans groups as its grid: compare --tune (a method's values and
    seeds), sweep (lr and seed axes) and reproduce --lr-grid (a row's lrs and seeds); the
    runs' names, folders and tracking labels differ and do not split them."""
    import yaml

    from fedshift.config.grid import parse_grid
    from fedshift.studies.papers.fedrc import FEDRC_TABLE1
    from fedshift.studies.reproduce import plan_table
    from fedshift.studies.sweep import plan_sweep
    from fedshift.studies.tune import parse_tune, tune_configs

    base = validate_config(tiny_config(tmp_path, scenario__validation_fraction=0.2))
    grid = parse_tune(["lr=0.02,0.05"])
    tune = [
        tune_configs(base, m, {"train.lr": lr}, s)
        for m in ("fedavg", "ifca")
        for lr in grid["train.lr"]
        for s in (0, 1)
    ]
    keys = [lockstep_key(c) for c in tune]
    assert len(set(keys[:4])) == 1 and len(set(keys[4:])) == 1 and keys[0] != keys[4]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    sweep = plan_sweep(path, parse_grid(["train.lr=0.01,0.03", "seed=0,1"]))
    assert len({lockstep_key(j.cfg) for j in sweep.jobs}) == 1 and len(sweep.jobs) == 4
    rows = plan_table(
        FEDRC_TABLE1, "fmnist", base, labels=["FedAvg"], seeds=2, lr_grid=[0.01, 0.03]
    )
    assert len(rows) == 4 and len({lockstep_key(j.cfg) for j in rows}) == 1
