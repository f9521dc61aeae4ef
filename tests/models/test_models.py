"""Tests for fedshift.models: shapes, head/body split, functional_call + vmap, errors, pretrained."""

from __future__ import annotations

import copy
import urllib.error

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedshift.core.errors import FedshiftError, UnknownNameError
from fedshift.models import (
    SplitModel,
    body_param_names,
    build_model,
    count_parameters,
    default_model_for,
    head_param_names,
    model_names,
)

# name, input shape, build options, feature_dim
CASES = [
    ("fmnist_cnn", (1, 28, 28), {}, 2048),
    ("fmnist_cnn", (3, 32, 32), {}, 2048),
    ("cifar_cnn", (3, 32, 32), {}, 192),
    ("resnet18", (3, 32, 32), {"norm": "batch"}, 512),
    ("resnet18", (3, 32, 32), {"norm": "group"}, 512),
    ("mobilenet_v2", (3, 32, 32), {}, 1280),
    ("mobilenet_v2", (1, 28, 28), {}, 1280),
    ("mlp", (32,), {}, 128),
    ("mlp", (32,), {"width": 16}, 16),
    ("lenet_small", (1, 8, 8), {}, 64),
]
IDS = [f"{name}-{'x'.join(map(str, shape))}-{opts}" for name, shape, opts, _ in CASES]


def _build(name: str, shape: tuple[int, ...], seed: int = 0, **opts: object) -> SplitModel:
    torch.manual_seed(seed)
    return build_model(name, 10, shape, **opts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "shape", "opts", "feature_dim"), CASES, ids=IDS)
def test_shapes_and_split(name: str, shape: tuple[int, ...], opts: dict, feature_dim: int) -> None:
    model = _build(name, shape, **opts).eval()
    assert isinstance(model, SplitModel)
    assert model.feature_dim == feature_dim
    x = torch.randn(2, *shape)
    with torch.no_grad():
        logits = model(x)
        features, logits2 = model(x, return_features=True)
    assert logits.shape == (2, 10)
    assert features.shape == (2, feature_dim)
    torch.testing.assert_close(logits, logits2)
    torch.testing.assert_close(model.head(features), logits)

    head, body = head_param_names(model), body_param_names(model)
    all_names = [n for n, _ in model.named_parameters()]
    assert head and body
    assert set(head).isdisjoint(body)
    assert sorted(head + body) == sorted(all_names)
    assert all(n.startswith("head.") for n in head)

    last_linear = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    assert last_linear[0].startswith("head")
    assert last_linear[1].in_features == feature_dim
    assert last_linear[1].out_features == 10
    assert sorted(head) == sorted(
        f"{last_linear[0]}.{p}" for p, _ in last_linear[1].named_parameters()
    )


def test_fmnist_cnn_parameter_count() -> None:
    expected = (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (1024 * 2048 + 2048) + (2048 * 10 + 10)
    assert count_parameters(_build("fmnist_cnn", (1, 28, 28))) == expected


def test_mobilenet_head_keeps_dropout() -> None:
    model = _build("mobilenet_v2", (3, 32, 32))
    assert isinstance(model.head, nn.Sequential)
    assert isinstance(model.head[0], nn.Dropout) and model.head[0].p == pytest.approx(0.2)
    assert head_param_names(model) == ["head.1.weight", "head.1.bias"]
    assert model.body[0][0][0].in_channels == 3
    assert _build("mobilenet_v2", (1, 28, 28)).body[0][0][0].in_channels == 1


def test_functional_call_return_features() -> None:
    model = _build("lenet_small", (1, 8, 8))
    x = torch.randn(4, 1, 8, 8)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    feats, logits = functional_call(model, state, (x,), {"return_features": True})
    torch.testing.assert_close(logits, model(x))
    assert feats.shape == (4, 64)


def _check_vmap(name: str, shape: tuple[int, ...], train: bool, **opts: object) -> None:
    models = [_build(name, shape, seed=s, **opts).train(train) for s in range(3)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def call(p: dict, b: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return functional_call(base, (p, b), (x,), {"return_features": True})

    torch.manual_seed(123)
    x = torch.randn(2, *shape)
    feats, logits = vmap(call, in_dims=(0, 0, None))(params, buffers, x)
    assert logits.shape == (3, 2, 10)
    for i, model in enumerate(models):
        f, out = model(x, return_features=True)
        torch.testing.assert_close(logits[i], out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(feats[i], f, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits[0], logits[1])  # the copies really differ


def test_vmap_fmnist_cnn() -> None:
    _check_vmap("fmnist_cnn", (1, 28, 28), train=True)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_vmap_resnet18_groupnorm(train: bool) -> None:
    _check_vmap("resnet18", (3, 32, 32), train=train, norm="group")


def test_resnet18_norm_layers() -> None:
    group = _build("resnet18", (3, 32, 32), norm="group")
    batch = _build("resnet18", (3, 32, 32), norm="batch")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in group.modules())
    gns = [m for m in group.modules() if isinstance(m, nn.GroupNorm)]
    assert gns and all(m.num_groups == 2 for m in gns)
    assert not list(group.buffers())
    assert any(isinstance(m, nn.BatchNorm2d) for m in batch.modules())
    assert group.body.conv1.kernel_size == (3, 3) and group.body.conv1.stride == (1, 1)
    assert count_parameters(batch) == count_parameters(group)  # same affine parameters


def test_unknown_model_name() -> None:
    with pytest.raises(UnknownNameError, match="unknown model 'nope'") as info:
        build_model("nope", 10, (3, 32, 32))
    assert info.value.allowed == model_names()
    assert {"fmnist_cnn", "cifar_cnn", "resnet18", "mobilenet_v2", "mlp", "lenet_small"} <= set(
        model_names()
    )


@pytest.mark.parametrize("name", ["resnet18", "fmnist_cnn"])
def test_bad_norm(name: str) -> None:
    with pytest.raises(FedshiftError, match="norm"):
        build_model(name, 10, (3, 32, 32), norm="layer")


def test_bad_options() -> None:
    with pytest.raises(FedshiftError, match="no pretrained weights"):
        build_model("cifar_cnn", 10, (3, 32, 32), pretrained=True)
    with pytest.raises(FedshiftError, match="no width option"):
        build_model("cifar_cnn", 10, (3, 32, 32), width=32)
    with pytest.raises(FedshiftError, match="image input_shape"):
        build_model("cifar_cnn", 10, (32,))
    with pytest.raises(FedshiftError, match="too small"):
        build_model("fmnist_cnn", 10, (1, 8, 8))
    with pytest.raises(FedshiftError, match="num_classes"):
        build_model("mlp", 0, (4,))


def _no_network(*args: object, **kwargs: object) -> None:
    raise urllib.error.URLError("network is unreachable")


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_pretrained_without_network(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", _no_network)
    with pytest.raises(
        FedshiftError, match=f"pretrained weights for {name} could not be downloaded"
    ):
        build_model(name, 10, (3, 32, 32), pretrained=True)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_resnet18_pretrained_loading(norm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.models import resnet18

    torch.manual_seed(42)
    source = resnet18(weights=None).state_dict()
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda *a, **k: source)
    fresh = _build("resnet18", (3, 32, 32), norm=norm)
    model = _build("resnet18", (3, 32, 32), norm=norm, pretrained=True)
    state = model.state_dict()
    torch.testing.assert_close(state["body.layer3.1.conv2.weight"], source["layer3.1.conv2.weight"])
    torch.testing.assert_close(
        state["body.layer2.0.downsample.0.weight"], source["layer2.0.downsample.0.weight"]
    )
    torch.testing.assert_close(state["body.bn1.weight"], source["bn1.weight"])
    torch.testing.assert_close(state["body.conv1.weight"], fresh.state_dict()["body.conv1.weight"])
    torch.testing.assert_close(state["head.weight"], fresh.state_dict()["head.weight"])
    if norm == "batch":
        torch.testing.assert_close(state["body.bn1.running_var"], source["bn1.running_var"])


def test_mobilenet_pretrained_grayscale(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.models import mobilenet_v2

    torch.manual_seed(42)
    source = mobilenet_v2(weights=None).state_dict()
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda *a, **k: source)
    model = _build("mobilenet_v2", (1, 28, 28), pretrained=True)
    state = model.state_dict()
    stem = source["features.0.0.weight"].sum(dim=1, keepdim=True)
    torch.testing.assert_close(state["body.0.0.0.weight"], stem)
    torch.testing.assert_close(
        state["body.0.18.1.running_mean"], source["features.18.1.running_mean"]
    )
    assert state["head.1.weight"].shape == (10, 1280)


@pytest.mark.parametrize(
    ("name", "shape", "opts"),
    [
        ("fmnist_cnn", (1, 28, 28), {}),
        ("cifar_cnn", (3, 32, 32), {}),
        ("resnet18", (3, 32, 32), {"norm": "group"}),
        ("mobilenet_v2", (3, 32, 32), {}),
        ("mlp", (5,), {}),
        ("lenet_small", (1, 8, 8), {}),
    ],
)
def test_deterministic_under_seed(name: str, shape: tuple[int, ...], opts: dict) -> None:
    a, b = _build(name, shape, seed=7, **opts), _build(name, shape, seed=7, **opts)
    c = _build(name, shape, seed=8, **opts)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_default_model_for() -> None:
    assert default_model_for("fmnist") == "fmnist_cnn"
    assert default_model_for("mnist") == "fmnist_cnn"
    assert default_model_for("cifar10") == "cifar_cnn"
    assert default_model_for("CIFAR100") == "cifar_cnn"
    assert default_model_for("tinyimagenet") == "resnet18"
    assert default_model_for("digits") == "lenet_small"
    assert default_model_for("synthetic") == "mlp"
    assert default_model_for("tiny-imagenet-200") == "resnet18"
    assert default_model_for("Fashion_MNIST") == "fmnist_cnn"
    assert default_model_for("cifar-10") == "cifar_cnn"
    with pytest.raises(UnknownNameError):
        default_model_for("imagenet")
