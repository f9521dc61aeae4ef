"""Tests for fedshift.core.registry.Registry and the registries built on it."""

from __future__ import annotations

import pytest

from fedshift.core.errors import FedshiftError, UnknownNameError
from fedshift.core.registry import Registry
from tests.conftest import ALL_CORRUPTIONS


def test_case_insensitive_lookup() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("Alpha", 1)
    assert reg.get("alpha") == reg.get("ALPHA") == reg.get(" Alpha ") == 1
    assert reg.canonical("ALPHA") == "alpha"
    assert "aLpHa" in reg and "beta" not in reg and 3 not in reg
    assert reg.names() == ["alpha"] and list(reg) == ["alpha"] and len(reg) == 1


def test_aliases() -> None:
    reg: Registry[str] = Registry("thing")

    @reg.register("cifar10", "cifar-10", "CIFAR_10")
    def entry() -> str:
        return "built"

    assert entry() == "built"  # the decorator returns the entry unchanged
    assert reg.get("Cifar-10") is entry and reg.get("cifar_10") is entry
    assert reg.canonical("CIFAR-10") == "cifar10"
    assert "cifar-10" in reg
    assert reg.names() == ["cifar10"]  # aliases are not names


def test_names_sorted_and_in_order() -> None:
    reg: Registry[int] = Registry("thing")
    for i, name in enumerate(["zeta", "alpha", "mid"]):
        reg.add(name, i)
    assert reg.names() == ["alpha", "mid", "zeta"]
    assert reg.in_order() == ["zeta", "alpha", "mid"]


def test_duplicate_registration_is_an_error() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1, "b")
    for name, aliases in [("a", ()), ("A ", ()), ("b", ()), ("c", ("a",)), ("d", ("B",))]:
        with pytest.raises(ValueError, match="registered twice"):
            reg.add(name, 2, *aliases)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(3)
    assert reg.get("a") == reg.get("b") == 1  # the first registration is kept
    assert "c" not in reg and "d" not in reg  # a clashing alias registers nothing


def test_unknown_name_lists_allowed() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("b", 1, "bee")
    reg.add("a", 2)
    for lookup in (reg.get, reg.canonical):
        with pytest.raises(UnknownNameError) as info:
            lookup("Nope")
        err = info.value
        assert isinstance(err, FedshiftError)
        assert (err.kind, err.name, err.allowed) == ("widget", "Nope", ["a", "b"])
        assert str(err) == "unknown widget 'Nope'; allowed: a, b"


def test_lazy_loader_runs_once() -> None:
    calls: list[int] = []

    def load() -> None:
        calls.append(1)
        reg.add("late", 7)
        assert "late" in reg  # looking up while loading does not load again

    reg: Registry[int] = Registry("thing", loader=load)
    reg.add("early", 1)  # registering does not load
    assert calls == []
    assert reg.get("late") == 7
    assert reg.names() == ["early", "late"] and "LATE" in reg and reg.get("early") == 1
    with pytest.raises(UnknownNameError):
        reg.get("missing")
    assert calls == [1]


ALGORITHM_NAMES = [
    "afedavg",
    "apfl",
    "cfl",
    "creff",
    "dfl",
    "ditto",
    "fedadagrad",
    "fedadam",
    "fedala",
    "fedavg",
    "fedavg-ft",
    "fedavgm",
    "fedbabu",
    "fedbn",
    "fedccfa",
    "feddaa",
    "feddrift",
    "feddyn",
    "fedem",
    "fedgen",
    "fednh",
    "fednova",
    "fedper",
    "fedproto",
    "fedprox",
    "fedrc",
    "fedrc-ft",
    "fedrc-shared",
    "fedrep",
    "fedrod",
    "fedsoft",
    "fedyogi",
    "fesem",
    "flash",
    "ifca",
    "lg-fedavg",
    "local",
    "moon",
    "oracle",
    "per-fedavg-fo",
    "per-fedavg-hf",
    "pfedme",
    "scaffold",
    "stocfl",
]


def test_converted_registries() -> None:
    from fedshift.algorithms.registry import ALGORITHMS
    from fedshift.data.concepts import LABEL_MAP_KINDS
    from fedshift.data.features import CORRUPTION_FUNCS, CORRUPTIONS
    from fedshift.data.partition import PARTITIONERS
    from fedshift.data.sources import DATASETS, dataset_names
    from fedshift.models import MODELS

    expected = {
        "dataset": (
            DATASETS,
            [
                "3dshapes",
                "cifar10",
                "cifar100",
                "circle",
                "digit-domains",
                "digits",
                "domainnet",
                "dsprites",
                "fmnist",
                "hf",
                "mnist",
                "office-caltech10",
                "sea",
                "sine",
                "synthetic",
                "tinyimagenet",
            ],
        ),
        "model": (
            MODELS,
            [
                "cifar_cnn",
                "convbn_cnn",
                "fmnist_cnn",
                "lenet_small",
                "mlp",
                "mobilenet_v2",
                "resnet18",
            ],
        ),
        "label shift": (
            PARTITIONERS,
            [
                "dirichlet",
                "dirichlet_capped",
                "dirichlet_equal",
                "dirichlet_seq",
                "flwr",
                "iid",
                "pathological",
                "quantity",
            ],
        ),
        "concept": (LABEL_MAP_KINDS, ["identity", "permutation", "random", "reverse", "shift"]),
        "corruption": (CORRUPTION_FUNCS, sorted(ALL_CORRUPTIONS)),
        "algorithm": (ALGORITHMS, ALGORITHM_NAMES),
    }
    for kind, (reg, names) in expected.items():
        assert isinstance(reg, Registry), kind
        assert reg.kind == kind
        assert reg.names() == names
    assert CORRUPTION_FUNCS.in_order() == ALL_CORRUPTIONS
    assert list(CORRUPTIONS) == ALL_CORRUPTIONS
    # the built-in order, whichever source module a test imported first
    assert dataset_names() == [
        "fmnist",
        "mnist",
        "cifar10",
        "cifar100",
        "tinyimagenet",
        "digits",
        "synthetic",
        "sea",
        "sine",
        "circle",
        "digit-domains",
        "dsprites",
        "3dshapes",
        "office-caltech10",
        "domainnet",
        "hf",
    ]


def test_converted_lookups_ignore_case() -> None:
    import numpy as np

    from fedshift.data.concepts import make_label_map, reverse_map
    from fedshift.data.features import apply_corruption
    from fedshift.data.partition import IIDPartitioner, make_partitioner
    from fedshift.data.sources import load_dataset
    from fedshift.models import build_model

    assert make_partitioner(" IID ") == IIDPartitioner()
    assert make_label_map({"kind": "Reverse"}, 4) == reverse_map(4)
    images = np.full((1, 8, 8, 1), 100, np.uint8)
    out = apply_corruption(images, "Identity", 3, np.random.default_rng(0))
    np.testing.assert_array_equal(out, images)
    assert load_dataset("SYNTHETIC", n_train=4, n_test=4, num_classes=2).name == "synthetic"
    assert build_model("MLP", 3, (5,), width=4).feature_dim == 4


def test_every_algorithm_names_its_paper_and_list_shows_it():
    from fedshift.algorithms import algorithm_names, get_algorithm
    from fedshift.reporting.catalogue import algorithm_lines

    missing = [n for n in algorithm_names() if not get_algorithm(n).paper.strip()]
    assert not missing, f"set `paper` on {missing}"
    lines = algorithm_lines()
    assert len(lines) == len(algorithm_names())
    for name, line in zip(algorithm_names(), lines, strict=True):
        assert line.split()[0] == name and get_algorithm(name).paper[:20] in line
