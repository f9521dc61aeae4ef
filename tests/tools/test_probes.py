"""The after-the-fact probes: a linear probe decodes a linearly encoded label and not noise;
a fresh critic separates dependent from independent feature pairs."""

import pytest
import torch

from fedshift.tools.probes import fresh_critic_mi, linear_probe


def test_linear_probe_reads_a_linear_label_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (800,), generator=g)
    signal = torch.nn.functional.one_hot(y, 5).float() @ torch.randn(5, 16, generator=g)
    x = signal + 0.3 * torch.randn(800, 16, generator=g)
    assert linear_probe(x, y) > 95
    assert linear_probe(torch.randn(800, 16, generator=g), y) < 35  # chance: 20%


def test_fresh_critic_separates_dependent_from_independent_pairs():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 8, generator=g)
    dep = fresh_critic_mi(a, a + 0.3 * torch.randn(1024, 8, generator=g), steps=200)
    ind = fresh_critic_mi(a, torch.randn(1024, 8, generator=g), steps=200)
    assert ind < 0.1 and dep > ind + 0.5


def test_recolour_repaints_a_background_as_the_scenario_would():
    import numpy as np

    from fedshift.data.attributes import client_color, paint
    from fedshift.tools.probes import recolour

    grey = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    grey[..., 1:] = grey[..., :1]  # one grey level per pixel
    a, b = client_color(2, 20), client_color(12, 20)
    one = torch.from_numpy(paint(grey, np.ones(3), a)).permute(0, 3, 1, 2)
    other = torch.from_numpy(paint(grey, np.ones(3), b)).permute(0, 3, 1, 2)
    out = recolour(one, torch.from_numpy(a), torch.from_numpy(b))
    assert (out.int() - other.int()).abs().max() <= 3  # uint8 rounding, twice
    assert (one.int() - other.int()).abs().max() > 50  # the colours do differ


def test_colour_swap_measures_features_and_predictions(tmp_path):
    from fedshift.config import validate_config
    from fedshift.data.attributes import client_color
    from fedshift.engine.evaluation import evaluate
    from fedshift.run.experiment import make_algorithm, run_experiment
    from fedshift.run.folder import RunDir
    from fedshift.tools.probes import colour_swap, recolour
    from tests.conftest import tiny_config

    colour = {"kind": "color", "mode": "background", "train_ratio": 0.5, "test_ratio": 0.5}
    raw = tiny_config(
        tmp_path,
        scenario={"dataset": "digits", "num_clients": 4, "attributes": colour},
        model={"name": "convbn_cnn"},
        train={"rounds": 2, "local_steps": 5, "batch_size": 16, "lr": 0.05},
    )
    cfg = validate_config(raw)
    res = run_experiment(cfg)
    out = colour_swap(res.run_dir, per_client=10_000)  # every test image
    assert set(out) == {"change_body", "acc", "acc_swapped"}
    assert out["change_body"] > 1.0  # a FedAvg body's features move with the colour
    # the run's own prediction on the unchanged images: its local accuracy
    assert out["acc"] == pytest.approx(res.history[-1]["local_acc"], abs=0.2)
    # on the repainted ones: the local accuracy the engine's evaluation gives once every
    # client's test images have the colour of the client half-way round (4 clients: k + 2)
    data, att = res.data, cfg.scenario.attributes
    state, _ = RunDir(res.run_dir).load_checkpoint(torch.device("cpu"))
    tests = [c.test_idx for c in data.clients]
    assert len(torch.cat(tests).unique()) == sum(len(t) for t in tests)  # no image shared
    colours = [torch.from_numpy(client_color(k, 4, att.saturation, att.value)) for k in range(4)]
    for c in data.clients:
        data.x[c.test_idx] = recolour(data.x[c.test_idx], colours[c.cid], colours[(c.cid + 2) % 4])
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    swapped = evaluate(algo, state.server, state.clients, data, train_metrics=False)
    assert out["acc_swapped"] == pytest.approx(swapped["local_acc"], abs=0.2)
    assert out["acc_swapped"] != out["acc"]
