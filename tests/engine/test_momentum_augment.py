"""Engine options of issue-9 fidelity: SGD momentum kept per client across rounds (equal to a
hand-run of persistent torch optimisers) and on-device crop + flip augmentation (equal to
torchvision's, deterministic per seed, the same under both executors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from torch.func import functional_call

from fedshift.algorithms.base import LocalTask
from fedshift.config import TrainConfig, validate_config
from fedshift.core.seeds import INIT_STREAM, derive_seed
from fedshift.data.augment import crop_flip, draw_crop_flip
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import (
    SequentialExecutor,
    augment_plans,
    client_generator,
    phase_plans,
)
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.conftest import as_float64, assert_close64, assert_same, float64, run_both, tiny_config

CPU = torch.device("cpu")
EXECUTORS = {
    "sequential": SequentialExecutor,
    "vmap": lambda: BatchedExecutor(4, "vmap"),
    "loop": lambda: BatchedExecutor(4, "loop"),
}


# ---------------------------------------------------------------------- momentum


def momentum_config(tmp_path, keep: bool):
    """Two clients, full participation, one full-batch step per round (the FedRC FMNIST case:
    180 samples, batch 128, drop_last -> one step), momentum 0.9 and weight decay."""
    return validate_config(
        tiny_config(
            tmp_path,
            scenario__num_clients=2,
            scenario__dataset_options={"n_train": 240, "n_test": 80, "dim": 8, "num_classes": 3},
            train={
                "rounds": 3,
                "batch_size": 512,
                "local_steps": 1,
                "lr": 0.2,
                "momentum": 0.9,
                "weight_decay": 1e-3,
                "keep_momentum": keep,
            },
            eval={"every": 3},
        )
    )


def hand_run(cfg, data, algo, keep: bool) -> dict[str, torch.Tensor]:
    """FedAvg with one torch.optim.SGD per client: kept across rounds (the global model is
    copied into the same tensors, as the FedRC code's load_state_dict) or new every round."""
    params, buffers = algo.ops.init(derive_seed(cfg.seed, INIT_STREAM, 0))
    glob = {k: v.clone() for k, v in params.items()}
    module, t = algo.ops.module, cfg.train
    leaves, opts = {}, {}
    for _ in range(t.rounds):
        new, weights = [], []
        for c in data.clients:
            if c.cid not in leaves or not keep:
                leaves[c.cid] = {k: v.clone().requires_grad_(True) for k, v in glob.items()}
                opts[c.cid] = torch.optim.SGD(
                    leaves[c.cid].values(),
                    lr=t.lr,
                    momentum=t.momentum,
                    weight_decay=t.weight_decay,
                )
            with torch.no_grad():
                for k, v in leaves[c.cid].items():
                    v.copy_(glob[k])
            opts[c.cid].zero_grad()
            logits = functional_call(module, (leaves[c.cid], buffers), (data.inputs(c.train_idx),))
            F.cross_entropy(logits, c.y_train).backward()
            opts[c.cid].step()
            new.append({k: v.detach().clone() for k, v in leaves[c.cid].items()})
            weights.append(c.num_train)
        glob = {
            k: sum(w * d[k] for w, d in zip(weights, new, strict=True)) / sum(weights) for k in glob
        }
    return glob


@pytest.mark.parametrize("executor", sorted(EXECUTORS))
def test_kept_momentum_equals_persistent_torch_optimisers(tmp_path, executor):
    """In float64 (torch's optimisers and ours sum in other orders: see F64_ATOL in
    tests/conftest.py)."""
    with float64():
        _kept_momentum_equals_persistent_torch_optimisers(tmp_path, executor)


def _kept_momentum_equals_persistent_torch_optimisers(tmp_path, executor):
    cfg = momentum_config(tmp_path, keep=True)
    data = as_float64(build_scenario(cfg.scenario, cfg.seed))
    algo = make_algorithm(cfg, data, CPU)
    state = Simulator(algo, data, sim_config(cfg), EXECUTORS[executor]()).run()
    expected = hand_run(cfg, data, algo, keep=True)
    for k, v in expected.items():
        assert_close64(state.server["params"][k], v, k)
    # the buffers are state: one per client, per model, per parameter
    assert sorted(state.momentum) == [0, 1] and set(state.momentum[0][0]) == set(expected)
    # and they matter: the reset run is the hand-run with fresh optimisers, and differs
    cfg_reset = momentum_config(tmp_path, keep=False)
    reset = Simulator(make_algorithm(cfg_reset, data, CPU), data, sim_config(cfg_reset)).run()
    fresh = hand_run(cfg_reset, data, algo, keep=False)
    k = next(iter(expected))
    assert_close64(reset.server["params"][k], fresh[k], k)
    assert not torch.allclose(reset.server["params"][k], expected[k], atol=1e-4)
    assert reset.momentum == {}


def test_kept_momentum_is_checkpointed_and_resumes_exactly(tmp_path):
    cfg = momentum_config(tmp_path, keep=True)
    full = run_experiment(cfg)
    raw = cfg.model_dump(mode="json")
    raw["train"]["rounds"], raw["name"] = 1, "part"
    run_experiment(validate_config(raw))
    raw["train"]["rounds"] = 3
    resumed = run_experiment(validate_config(raw), resume=True)
    assert resumed.history[-1]["train_loss"] == full.history[-1]["train_loss"]
    assert resumed.history[-1]["global_acc"] == full.history[-1]["global_acc"]


def test_kept_momentum_batched_equals_sequential_with_unequal_clients(tmp_path, vectorize):
    """Partial participation (clients return after skipped rounds), unequal sizes and steps."""
    cfg = validate_config(
        tiny_config(
            tmp_path,
            train__rounds=3,
            train__participation=0.5,
            train__local_epochs=2,
            train__keep_momentum=True,
            scenario__num_clients=8,
            scenario__label_shift={"kind": "quantity", "alpha": 0.5},
        )
    )
    assert_same(*run_both(cfg, chunk_size=3, vectorize=vectorize))


@pytest.fixture(params=["vmap", "loop"])
def vectorize(request):
    return request.param


# ---------------------------------------------------------------------- augmentation


def test_crop_flip_equals_torchvision():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 8, 8), generator=g, dtype=torch.uint8)
    params = draw_crop_flip(6, 2, g)
    out = crop_flip(images, params, 2)
    for img, (dy, dx, flip), got in zip(images, params.tolist(), out, strict=True):
        ref = TF.crop(TF.pad(img, [2]), dy, dx, 8, 8)  # RandomCrop(8, padding=2)
        ref = TF.hflip(ref) if flip else ref
        assert torch.equal(got, ref)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    # offsets cover 0..2*padding, both flips occur
    many = draw_crop_flip(2000, 2, torch.Generator().manual_seed(1))
    assert set(many[:, 0].tolist()) == set(range(5)) and set(many[:, 2].tolist()) == {0, 1}


def test_augmentation_drawn_from_the_client_stream():
    augmented = TrainConfig(batch_size=4, local_epochs=2, drop_last=False, augment="crop_flip")
    unaugmented = TrainConfig(batch_size=4, local_epochs=2, drop_last=False)

    task = LocalTask(params=[{}], buffers=[{}])

    def draws(seed, rnd, cid):
        gen = client_generator(seed, rnd, cid)
        plans = phase_plans(task, 10, augmented, gen)
        return plans, augment_plans(plans, augmented, gen)

    (p1, a1), (_, a2) = draws(0, 1, 3), draws(0, 1, 3)
    assert all(torch.equal(x, y) for x, y in zip(a1[0], a2[0], strict=True))
    # the batch order is the same as without augmentation (drawn first)
    plain = phase_plans(task, 10, unaugmented, client_generator(0, 1, 3))
    assert all(torch.equal(x, y) for x, y in zip(plain[0], p1[0], strict=True))
    assert [len(a) for a in a1[0]] == [len(b) for b in p1[0]]
    for other in (draws(1, 1, 3), draws(0, 2, 3), draws(0, 1, 4)):  # seed, round, client
        assert not all(torch.equal(x, y) for x, y in zip(a1[0], other[1][0], strict=True))
    assert augment_plans(p1, unaugmented, client_generator(0, 1, 3)) is None


def augment_config(tmp_path, augment: str = "crop_flip", seed: int = 0):
    return validate_config(
        tiny_config(
            tmp_path,
            seed=seed,
            scenario__dataset="digits",
            scenario__dataset_options={},
            scenario__num_clients=4,
            scenario__train_fraction_of_dataset=0.3,
            scenario__label_shift={"kind": "quantity", "alpha": 1.0},
            model={"name": "lenet_small"},
            train={
                "rounds": 2,
                "batch_size": 16,
                "lr": 0.05,
                "augment": augment,
                "crop_padding": 2,
                "drop_last": False,
            },
        )
    )


def test_augmented_training_is_the_same_under_both_executors(tmp_path, vectorize):
    cfg = augment_config(tmp_path)
    seq, bat = run_both(cfg, chunk_size=3, vectorize=vectorize)
    assert_same(seq, bat)
    # augmentation changes the training (so the comparison above is not vacuous)
    plain, _ = run_both(augment_config(tmp_path, "none"), chunk_size=3, vectorize=vectorize)
    k = next(iter(seq.server["params"]))
    assert not torch.allclose(plain.server["params"][k], seq.server["params"][k])


def test_augmented_training_is_deterministic_per_seed(tmp_path):
    def final(seed):
        cfg = augment_config(tmp_path, seed=seed)
        data = build_scenario(cfg.scenario, 0)  # the same data: only training draws differ
        algo = make_algorithm(cfg, data, CPU)
        return Simulator(algo, data, sim_config(cfg)).run().server["params"]

    a, b, c = final(0), final(0), final(1)
    k = next(iter(a))
    assert torch.equal(a[k], b[k]) and not torch.equal(a[k], c[k])


def test_augmentation_needs_images(tmp_path):
    from fedshift.core.errors import ConfigError

    cfg = validate_config(tiny_config(tmp_path, train__augment="crop_flip"))
    with pytest.raises(ConfigError, match="needs images"):
        run_experiment(cfg)
