"""The after-the-fact probes: a linear probe decodes a linearly encoded label and not noise,
also within each client; colour measures on one network tell a colour-blind extractor from one
that reads the colour; a run's images repainted as the scenario would."""

import numpy as np
import pytest
import torch

from fedshift.data.attributes import client_color, color_pair, paint
from fedshift.tools.probes import (
    colour_sensitivity,
    cross_colour_transfer,
    grey_levels,
    linear_probe,
    paint_grey,
    within_client_probe,
)
from tests.tools.conftest import labelled_clients


def test_linear_probe_reads_a_linear_label_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (800,), generator=g)
    signal = torch.nn.functional.one_hot(y, 5).float() @ torch.randn(5, 16, generator=g)
    x = signal + 0.3 * torch.randn(800, 16, generator=g)
    assert linear_probe(x, y) > 95
    assert linear_probe(torch.randn(800, 16, generator=g), y) < 35  # chance: 20%


@pytest.mark.parametrize("hidden", [0, 32])
def test_within_client_probe_reads_the_side_that_carries_the_label(hidden):
    train = labelled_clients(clients=4, per_client=120, seed=0)
    test = labelled_clients(clients=4, per_client=120, seed=0)
    test = {**test, "x": test["x"] + 0.1 * torch.randn(test["x"].shape)}  # new noise, same nets
    carried = within_client_probe(train, test, "x", hidden=hidden, steps=200)
    empty = within_client_probe(train, labelled_clients(4, 120, seed=1), "noise", hidden, 200)
    assert len(carried.values) == 4
    assert carried.mean > 95
    assert empty.mean < 40 and empty.chance < 40  # 5 labels: chance about 20%


def test_grey_levels_undo_the_scenarios_painting():
    grey = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    grey[..., 1:] = grey[..., :1]
    m = torch.from_numpy(grey[..., :1]).permute(0, 3, 1, 2).float() / 255.0
    for mode in ("background", "foreground"):
        fg, bg = color_pair(mode, client_color(3, 20))
        painted = torch.from_numpy(paint(grey, fg, bg)).permute(0, 3, 1, 2)
        back = grey_levels(painted, torch.from_numpy(fg), torch.from_numpy(bg))
        assert (back - m).abs().max() < 2 / 255
        again = paint_grey(back, torch.from_numpy(fg), torch.from_numpy(bg))
        assert (again.int() - painted.int()).abs().max() <= 1


def test_colour_sensitivity_tells_colour_blind_from_colour_reading(colour_world):
    w = colour_world
    m, y = w.images(120)
    blind = colour_sensitivity(w.content_only, w.render, m, y, [0, 1, 2, 3])
    sees = colour_sensitivity(w.colour_only, w.render, m, y, [0, 1, 2, 3])
    assert blind["colour"] == 0 and blind["ratio"] == 0
    assert blind["content"] > 0.1
    assert sees["ratio"] > 100  # content distance 0: only the colour moves it


def test_cross_colour_transfer_drop(colour_world):
    w = colour_world
    train, test = w.images(200), w.images(200)
    blind = cross_colour_transfer(w.content_only, w.render, train, test, [0, 1, 2, 3], 200)
    tangled = cross_colour_transfer(w.entangled, w.render, train, test, [0, 1, 2, 3], 200)
    assert blind["same"] > 95 and blind["drop"] == 0
    assert tangled["same"] > 95 and tangled["drop"] > 30


def test_recolour_repaints_a_background_as_the_scenario_would():
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


@pytest.mark.parametrize("extra", [{"colors_per_client": 2}, {"hue_jitter": 0.05}, {}])
def test_scenario_images_take_off_each_images_own_colour(extra):
    """With two colours a client (or hue jitter) half a client's images are not in its first
    colour: the grey levels must come from each image's recorded hue, so that painting them
    again in that hue gives the scenario's image back."""
    from types import SimpleNamespace

    from fedshift.config.scenario import ScenarioConfig
    from fedshift.data.attributes import hue_colors
    from fedshift.data.scenario import build_scenario
    from fedshift.tools.probes import scenario_images

    cfg = ScenarioConfig.model_validate(
        {"dataset": "digits", "num_clients": 4, "attributes": {"kind": "color", **extra}}
    )
    data = build_scenario(cfg, 0)
    data.meta["config"] = SimpleNamespace(scenario=cfg)
    m, _, _ = scenario_images(data, "train", per_client=30)
    idx = torch.cat([c.train_idx[:30] for c in data.clients])
    hues = data.meta["attributes"]["hue"][idx.numpy()]
    rgb = torch.from_numpy(hue_colors(hues, 1.0, 0.8).reshape(-1, 3))
    again = torch.cat([paint_grey(m[i : i + 1], torch.ones(3), rgb[i]) for i in range(len(idx))])
    assert (again.int() - data.x[idx].int()).abs().max() <= 1
