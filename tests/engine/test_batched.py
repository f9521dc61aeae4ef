"""The batched executor gives the same models and metrics as the sequential reference."""

import pytest
import torch

from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from tests.conftest import (
    RUN,
    as_float64,
    assert_close64,
    assert_same,
    float64,
    run_both,
    tiny_config,
)


@pytest.fixture(params=["vmap", "loop"])
def vectorize(request):
    """Both ways the batched executor computes gradients: vmap (GPU) and a loop (CPU)."""
    return request.param


@pytest.mark.parametrize(
    "algorithm", [{"name": "fedavg"}, {"name": "fedprox", "params": {"mu": 0.1}}]
)
def test_unequal_clients_partial_participation(tmp_path, algorithm, vectorize):
    """Quantity skew gives clients of very different sizes (some below the batch size, so
    padded batches and unequal step counts); half the clients are sampled per round."""
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm=algorithm,
            train__rounds=3,
            train__participation=0.5,
            train__batch_size=32,
            train__local_epochs=2,
            scenario__num_clients=10,
            scenario__label_shift={"kind": "quantity", "alpha": 0.5},
        )
    )
    seq, bat = run_both(cfg, chunk_size=3, vectorize=vectorize)  # several chunks
    sizes = [c.num_train for c in build_scenario(cfg.scenario, 0).clients]
    assert min(sizes) < 32 < max(sizes) and len(set(sizes)) > 3
    assert_same(seq, bat)


def test_ragged_last_batch_without_drop_last(tmp_path, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            train__rounds=2,
            train__drop_last=False,
            train__batch_size=24,
            train__momentum=0.0,
            scenario__label_shift={"kind": "dirichlet", "alpha": 0.5},
        )
    )
    assert_same(*run_both(cfg, vectorize=vectorize))


def test_batchnorm_model(tmp_path, vectorize):
    """ResNet-18 with BatchNorm: running statistics per client match the sequential run.

    This tiny ResNet on 8x8 images (1x1 maps before pooling) is chaotic at larger learning
    rates: at lr 0.01 a 1e-7 perturbation of the start point alone moves the sequential run by
    0.3 after 14 steps. At lr 0.002 trajectories are stable; compared in float64 (see
    F64_ATOL in fedshift/testing.py)."""
    cfg = validate_config(
        tiny_config(
            tmp_path,
            train__rounds=2,
            train__batch_size=16,
            train__lr=0.002,
            train__participation=0.75,
            scenario__dataset="digits",
            scenario__dataset_options={},
            scenario__num_clients=4,
            scenario__train_fraction_of_dataset=0.25,
            scenario__label_shift={"kind": "quantity", "alpha": 1.0},
            model={"name": "resnet18", "norm": "batch", "width": 8},
        )
    )
    seq, bat = run_both(cfg, chunk_size=2, vectorize=vectorize)
    assert any("running_mean" in k for k in seq.server["buffers"])
    assert_same(seq, bat)


def test_local_clients_keep_separate_models(tmp_path, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path, algorithm={"name": "local"}, train__rounds=2, train__participation=0.5
        )
    )
    seq, bat = run_both(cfg, chunk_size=2, vectorize=vectorize)
    for cid, st in seq.clients.items():
        if "params" in st:
            for k, v in st["params"].items():
                assert_close64(bat.clients[cid]["params"][k], v, f"client {cid} {k}")


def test_batchnorm_layer_matches_torch_and_vmaps_exactly():
    """fedshift's BatchNorm2d equals nn.BatchNorm2d, and under vmap its gradients equal the
    unbatched ones (torch's own batch_norm differs by up to ~1% under vmap)."""
    import torch.nn.functional as F
    from torch import nn
    from torch.func import functional_call, grad, vmap

    from fedshift.models.base import BatchNorm2d

    torch.manual_seed(0)
    ours, ref = BatchNorm2d(4), nn.BatchNorm2d(4)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(6, 4, 5, 5, requires_grad=True)
    ya, yb = ours(x), ref(x)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    (ga,) = torch.autograd.grad((ya**2).sum(), x)
    (gb,) = torch.autograd.grad((yb**2).sum(), x)
    torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4)
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, key), getattr(ref, key))
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)

    net = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        BatchNorm2d(8),
        nn.Flatten(),
        nn.LazyLinear(5),
    )
    net(torch.randn(2, 3, 9, 9))
    net.train()
    params = {k: v.detach() for k, v in net.named_parameters()}
    bufs = {k: v.detach() for k, v in net.named_buffers()}
    xs, ys = torch.randn(3, 13, 3, 9, 9), torch.randint(0, 5, (3, 13))

    def loss(p, b, x, y):
        return F.cross_entropy(functional_call(net, (p, b), (x,)), y)

    # one forward and backward in float32: the batched and single gradients differ by the
    # roundoff of one pass (a few 6e-8 relative), far below the 1e-5 compared to
    stacked_bufs = {k: torch.stack([v] * 3) for k, v in bufs.items()}  # each client its own
    stacked = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, stacked_bufs, xs, ys)
    for c in range(3):
        single = grad(loss)(params, {k: v.clone() for k, v in bufs.items()}, xs[c], ys[c])
        for k in params:
            torch.testing.assert_close(stacked[k][c], single[k], atol=1e-5, rtol=1e-4)


def test_k_models_with_per_sample_weights(vectorize):
    """K=3 models per client with a per-client, per-sample weight extra of unequal lengths
    (FedRC's shape of local work) train identically on both executors (in float64: see
    F64_ATOL in fedshift/testing.py)."""
    with float64():
        _k_models_with_per_sample_weights(vectorize)


def _k_models_with_per_sample_weights(vectorize):
    from fedshift.algorithms.base import ModelOps, RoundContext
    from fedshift.engine.evaluation import client_data
    from fedshift.engine.executors.base import RoundWork
    from fedshift.models import build_model
    from fedshift.tools.bench import KModelLoss, random_data

    data = as_float64(random_data(5, 40, (1, 8, 8), torch.device("cpu")))
    for i, c in enumerate(data.clients):  # unequal sizes: 40, 31, 22, 13, 4 samples
        keep = 40 - 9 * i
        c.train_idx, c.y_train = c.train_idx[:keep], c.y_train[:keep]
    ops = ModelOps(lambda: build_model("lenet_small", 10, (1, 8, 8)), torch.device("cpu"))
    algo = KModelLoss(KModelLoss.Params(), ops, 10, **RUN)
    server = algo.init_server_state([ops.init(k) for k in range(3)])
    jobs = [
        (algo.client_task(server, {}, v, RoundContext(1)), v)
        for v in map(lambda c: client_data(data, c), data.clients)
    ]
    work = RoundWork.of(
        lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=16, local_epochs=2, drop_last=True
    )
    seq = list(SequentialExecutor().train(algo, jobs, work))
    bat = sorted(BatchedExecutor(2, vectorize).train(algo, jobs, work), key=lambda r: r.cid)
    for a, b in zip(seq, bat, strict=True):
        assert a.telemetry["steps"] == b.telemetry["steps"]
        for k in range(3):
            moved = max(
                (a.params[k][n] - server["models"][k]["params"][n]).abs().max() for n in a.params[k]
            )
            assert moved > 1e-3  # every model was trained
            for n in a.params[k]:
                assert_close64(b.params[k][n], a.params[k][n], f"client {a.cid} model {k} {n}")


def test_stacked_sgd_clips_clients_with_scalar_parameters_as_sgd_step_does():
    """A parameter with no dimensions of its own (APFL's mixing weight) stacks to [C]; the
    stacked clipped step equals the per-client one."""
    from fedshift.engine.executors.stage import _stacked_sgd
    from fedshift.engine.training import SGDConfig, sgd_step

    torch.manual_seed(0)
    cfg = SGDConfig(lr=0.1, grad_clip=0.5)
    ps = [torch.randn(3), torch.randn(3, 4)]
    gs = [torch.randn(3) * 3, torch.randn(3, 4) * 3]
    stacked = [p.clone() for p in ps]
    _stacked_sgd(stacked, [g.clone() for g in gs], [None, None], torch.ones(3), cfg)
    for c in range(3):
        one = [ps[0][c].clone(), ps[1][c].clone()]
        sgd_step(one, [gs[0][c], gs[1][c]], [None, None], cfg)
        assert torch.allclose(stacked[0][c], one[0]) and torch.allclose(stacked[1][c], one[1])
