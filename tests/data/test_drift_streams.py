"""The drift streams (SEA, SINE, Circle; :mod:`fedshift.data.sources.streams`): each
generator's labels against its formula, the concepts' disagreement, determinism, labels after a
change point, the recorded truth, a tiny run and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedshift.config import load_config, validate_config
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.data.concepts import DecisionConcept, make_concept
from fedshift.data.scenario import build_scenario
from fedshift.data.sources import load_dataset
from fedshift.data.truth import concept_schedule, truth_record
from fedshift.run.experiment import run_experiment
from fedshift.studies.papers.drift_streams import DRIFT_STREAMS, STREAMS
from tests.conftest import run_cli, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def sea(x: np.ndarray, theta: float) -> np.ndarray:
    x = x.astype(np.float64)
    return (x[:, 0] + x[:, 1] <= theta).astype(int)


def sine(x: np.ndarray, curve: str, reverse: bool) -> np.ndarray:
    x = x.astype(np.float64)
    f = np.sin(x[:, 0]) if curve == "sine1" else 0.5 + 0.3 * np.sin(3 * np.pi * x[:, 0])
    below = x[:, 1] <= f
    return (~below if reverse else below).astype(int)


def circle(x: np.ndarray, cx: float, cy: float, r: float) -> np.ndarray:
    x = x.astype(np.float64)
    return ((x[:, 0] - cx) ** 2 + (x[:, 1] - cy) ** 2 <= r**2).astype(int)


#: each stream's concepts as the formulas above
FORMULAS = {
    "sea": [lambda x, t=t: sea(x, t) for t in (8, 9, 7, 9.5)],
    "sine": [
        lambda x, c=c, r=r: sine(x, c, r)
        for c, r in (("sine1", False), ("sine1", True), ("sine2", False), ("sine2", True))
    ],
    "circle": [
        lambda x, c=c: circle(x, *c)
        for c in ((0.2, 0.5, 0.15), (0.4, 0.5, 0.2), (0.6, 0.5, 0.25), (0.8, 0.5, 0.3))
    ],
}


# ---------------------------------------------------------------------- the generators


@pytest.mark.parametrize("name", ["sea", "sine", "circle"])
def test_each_generator_labels_by_its_formula(name):
    raw = load_dataset(name, n_train=4000, n_test=1000)
    dim, high = (3, 10.0) if name == "sea" else (2, 1.0)
    assert raw.x_train.shape == (4000, dim) and raw.x_train.dtype == np.float32
    assert raw.x_train.min() >= 0 and raw.x_train.max() <= high and raw.num_classes == 2
    assert len(raw.concepts) == 4 and all(isinstance(c, DecisionConcept) for c in raw.concepts)
    for k, formula in enumerate(FORMULAS[name]):
        got = raw.concepts[k].apply(raw.y_train, raw.x_train)
        assert (got == formula(raw.x_train)).all(), (name, k)
        assert 0 < got.mean() < 1  # both classes occur
    assert (raw.y_train == FORMULAS[name][0](raw.x_train)).all()  # the dataset's labels: 0
    assert (raw.y_test == FORMULAS[name][0](raw.x_test)).all()


def test_sea_ignores_its_third_feature_and_specs_name_other_concepts():
    raw = load_dataset("sea", n_train=2000, n_test=10)
    x = raw.x_train.copy()
    x[:, 2] = 10 - x[:, 2]
    assert (raw.concepts[0].apply(raw.y_train, x) == raw.y_train).all()
    c = make_concept("sea:8.5", 2, dataset=raw)
    assert c.name == "sea(theta=8.5)" and (c.apply(raw.y_train, x) == sea(x, 8.5)).all()
    assert make_concept({"kind": "sea", "theta": 9}, 2, dataset=raw) == raw.concepts[1]
    ring = make_concept("circle:0.5,0.5,0.3", 2, dataset=load_dataset("circle", n_train=9))
    assert ring.params == (("cx", 0.5), ("cy", 0.5), ("r", 0.3))
    rev = make_concept({"kind": "sine", "curve": "sine2", "reverse": True}, 2,
                       dataset=load_dataset("sine", n_train=9))  # fmt: skip
    assert rev == load_dataset("sine", n_train=9).concepts[3]
    assert (
        make_concept("reverse", 2, dataset=raw).apply(raw.y_train).tolist()
        == (1 - raw.y_train).tolist()
    )  # a label map still works on a stream (it flips concept 0's labels)


def test_concepts_disagree_on_a_known_share_of_the_inputs():
    raw = load_dataset("sea", n_train=200_000, n_test=10)
    x, y = raw.x_train, raw.y_train
    s = x[:, 0].astype(np.float64) + x[:, 1]
    differ = raw.concepts[0].apply(y, x) != raw.concepts[1].apply(y, x)
    assert (differ == ((s > 8) & (s <= 9))).all()  # thresholds 8 and 9: exactly the band
    assert differ.mean() == pytest.approx((81 - 64) / 200, abs=0.004)  # 8.5% of [0, 10]^2
    sine_raw = load_dataset("sine", n_train=20_000, n_test=10)
    a, b = (sine_raw.concepts[i].apply(sine_raw.y_train, sine_raw.x_train) for i in (0, 1))
    assert (a != b).all()  # a reversed concept flips every label
    circ = load_dataset("circle", n_train=200_000, n_test=10)
    a, b = (circ.concepts[i].apply(circ.y_train, circ.x_train) for i in (0, 2))
    # circles (0.2, 0.5, 0.15) and (0.6, 0.5, 0.25) touch but do not overlap
    assert (a != b).mean() == pytest.approx(np.pi * (0.15**2 + 0.25**2), abs=0.004)


def test_generation_is_deterministic_by_seed():
    for name in ("sea", "sine", "circle"):
        a, b = (
            load_dataset(name, n_train=500, n_test=50),
            load_dataset(name, n_train=500, n_test=50),
        )
        c = load_dataset(name, n_train=500, n_test=50, seed=1)
        assert (a.x_train == b.x_train).all() and (a.y_test == b.y_test).all()
        assert not np.array_equal(a.x_train, c.x_train)


def test_label_noise_flips_the_same_samples_under_every_concept():
    clean = load_dataset("sea", n_train=50_000, n_test=10)
    noisy = load_dataset("sea", n_train=50_000, n_test=10, noise=0.1)
    assert (clean.x_train == noisy.x_train).all()
    flips = [
        noisy.concepts[k].apply(noisy.y_train, noisy.x_train)
        != clean.concepts[k].apply(clean.y_train, clean.x_train)
        for k in range(4)
    ]
    assert flips[0].mean() == pytest.approx(0.1, abs=0.01)
    assert all((f == flips[0]).all() for f in flips)  # noise is a property of the sample


# ---------------------------------------------------------------------- scenarios


def stream_config(tmp_path, name="sea", to=3, at=4, rounds=6, **over) -> dict:
    return tiny_config(
        tmp_path,
        scenario={
            "dataset": name,
            "dataset_options": {"n_train": 1200, "n_test": 200},
            "num_clients": 6,
            "label_shift": {"kind": "iid"},
            "concepts": [0, 1, 2, 3],
            "test_fraction": 0.25,
            "test_clients": {"enabled": False},
            "drift": {
                "rounds": rounds,
                "start": [0],
                "events": [{"kind": "sudden", "at": at, "to": to, "clients": [1, 4]}],
            },
        },
        model={"name": "mlp", "width": 16},
        train={"rounds": rounds, "batch_size": 32, "lr": 0.05, "participation": 1.0},
        **over,
    )


@pytest.mark.parametrize("name, to", [("sea", 3), ("sine", 1), ("circle", 2)])
def test_after_the_change_point_drifted_clients_follow_the_new_concept(tmp_path, name, to):
    cfg = validate_config(stream_config(tmp_path, name, to))
    data = build_scenario(cfg.scenario, cfg.seed)
    raw = load_dataset(name, n_train=1200, n_test=200)
    assert data.step_starts == [1, 4]
    for r in (1, 3, 4, 6):
        for c in data.steps[data.step_of_round(r) - 1]:
            want = to if (c.cid in (1, 4) and r >= 4) else 0
            assert c.concept == want, (r, c.cid)
            for idx, y in ((c.train_idx, c.y_train), (c.test_idx, c.y_test)):
                x = raw.x_train[data.origin[idx.numpy()]]  # the raw inputs of the samples
                assert (y.numpy() == FORMULAS[name][want](x)).all(), (r, c.cid)
                if want != 0:  # and not the old concept's, where the two disagree
                    assert (y.numpy() != FORMULAS[name][0](x)).any()
    # every client keeps its inputs: only the labels of the drifted ones change
    first, last = data.steps[0], data.steps[-1]
    assert all((a.train_idx == b.train_idx).all() for a, b in zip(first, last, strict=True))
    assert [a.y_train.equal(b.y_train) for a, b in zip(first, last, strict=True)] == [
        True, False, True, True, False, True
    ]  # fmt: skip
    # the pool holds standardised features (the labels were made from the raw ones)
    assert data.x.shape[1] == raw.x_train.shape[1]
    assert data.x.mean().abs() < 0.1 and (data.x.std(0) - 1).abs().max() < 0.1


def test_the_truth_records_the_change_points(tmp_path):
    cfg = validate_config(stream_config(tmp_path, "circle", 2, at=3, rounds=7))
    data = build_scenario(cfg.scenario, cfg.seed)
    truth = concept_schedule(data, 7)
    want = np.zeros((6, 7), dtype=int)
    want[[1, 4], 2:] = 2
    assert (truth == want).all()
    rec = truth_record(data, 7)
    assert rec["onsets"] == [[], [3], [], [], [3], []]
    assert rec["concepts"] == want.tolist()


def test_a_tiny_fedavg_run_on_a_stream(tmp_path):
    cfg = validate_config(stream_config(tmp_path, "sine", 1, at=3, rounds=4))
    res = run_experiment(cfg)
    assert len(res.history) == 4 and 0 <= res.history[-1]["local_acc"] <= 100
    assert res.summary["truth"]["onsets"] == [[], [3], [], [], [3], []]
    saved = json.loads((Path(cfg.output.dir) / cfg.name / "summary.json").read_text())
    assert saved["truth"]["concepts"][1] == [0, 0, 1, 1]


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "over, match",
    [
        ({"concepts": [0, 1, 2, 4]}, r"concepts\.3: dataset 'sea' has concepts 0\.\.3, not 4"),
        ({"concepts": [0, 1, 2, "sea:abc"]}, r"scenario\.concepts\.3: .*theta must be a number"),
        ({"concepts": [0, 1, 2, {"kind": "sea", "thetaa": 8}]}, r"unexpected parameter 'thetaa'"),
        ({"concepts": [0, 1, 2, "sea"]}, r"'sea' needs a threshold"),
        ({"dataset_options": {"n_train": 100, "noise": 0.7}}, r"sea: noise must be a share"),
        ({"dataset_options": {"n_train": 100, "theta": [8]}}, r"does not accept option\(s\) theta"),
        ({"dataset_options": {"n_train": 100, "thetas": []}}, r"thetas must be a non-empty list"),
    ],
)
def test_invalid_keys_are_one_line_config_errors(tmp_path, over, match):
    raw = stream_config(tmp_path)
    raw["scenario"].update(over)
    cfg = validate_config(raw)
    with pytest.raises(FedshiftError, match=match) as info:
        build_scenario(cfg.scenario, cfg.seed)
    assert "\n" not in str(info.value)


def test_stream_concepts_elsewhere_and_label_swaps_are_refused(tmp_path):
    raw = tiny_config(tmp_path, scenario__concepts=[0])  # synthetic data: no own concepts
    with pytest.raises(ConfigError, match="dataset 'synthetic' has none; use a label map"):
        build_scenario(validate_config(raw).scenario, 0)
    raw = stream_config(tmp_path)
    raw["scenario"]["drift"]["events"] = [{"kind": "label_swap", "at": 3, "pairs": [[0, 1]]}]
    with pytest.raises(ConfigError, match="label_swap swaps the classes of a label map"):
        build_scenario(validate_config(raw).scenario, 0)
    bad = stream_config(tmp_path, "circle")
    bad["scenario"]["dataset_options"]["circles"] = [[0.5, 0.5, -1]]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    res = run_cli("scenario", str(path), cwd=tmp_path)
    assert res.returncode == 2 and "radius must be > 0" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


# ---------------------------------------------------------------------- the benchmark


def test_the_stream_configs_are_the_benchmark_columns():
    assert list(STREAMS) == ["sea", "sine", "circle"] == list(DRIFT_STREAMS.configs)
    assert [v.algorithm for v in DRIFT_STREAMS.variants] == [
        "fedavg", "feddaa", "feddrift", "flash", "fedccfa", "oracle"
    ]  # fmt: skip
    shared = None
    for name, path in STREAMS.items():
        cfg = load_config(ROOT / path)  # validates
        assert cfg.scenario.dataset == name and cfg.scenario.drift.rounds == 30
        raw = yaml.safe_load((ROOT / path).read_text())
        del raw["name"], raw["scenario"]["dataset"], raw["scenario"]["drift"]["events"][0]["to"]
        shared = shared or raw
        assert raw == shared, name  # the columns differ in the stream and its new concept only
