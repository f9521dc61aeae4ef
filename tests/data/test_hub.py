"""Datasets in the Hugging Face format (the ``hf`` source) and the flwr-datasets interop, both
ways (issue 25), offline, on a tiny dataset made here: 16x16 RGB images of 4 classes (class c
is a bright band at rows 4c..4c+3) with a ``site`` column, saved with ``save_to_disk`` and also
written as parquet files and as an image folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before datasets is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.conftest import ROOT, require_extra  # noqa: E402

datasets = require_extra("datasets", "hub")
flwr_datasets = require_extra("flwr_datasets", "hub")

from flwr_datasets import FederatedDataset  # noqa: E402
from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner  # noqa: E402

from fedshift.config import validate_config  # noqa: E402
from fedshift.config.scenario import ScenarioConfig  # noqa: E402
from fedshift.core.errors import ConfigError, DatasetNotFoundError, FedshiftError  # noqa: E402
from fedshift.data.partition import make_partitioner  # noqa: E402
from fedshift.data.scenario import build_scenario  # noqa: E402
from fedshift.data.sources import load_dataset  # noqa: E402
from fedshift.data.sources.hub import read_hub  # noqa: E402
from fedshift.flower.partitioner import ScenarioPartitioner  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No network, whichever test imported datasets first."""
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


CLASSES = ["ant", "bee", "cat", "dog"]  # sorted, as an image folder names them


def images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Noisy 16x16 RGB images; class c has a bright band at rows 4c..4c+3."""
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 70, (n, 16, 16, 3)).astype(np.uint8)
    for i, c in enumerate(y):
        x[i, 4 * c : 4 * c + 4] += 160
    return x, y


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict[str, Path]:
    """The tiny dataset's copies: ``disk`` (save_to_disk), ``parquet`` (a folder of
    train.parquet and test.parquet), ``imagefolder`` (<split>/<class>/<i>.png)."""
    root = tmp_path_factory.mktemp("hub")
    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "site": datasets.Value("int64"),
            "id": datasets.Value("int64"),
        }
    )
    splits = {}
    for split, n, start in (("train", 240, 0), ("test", 80, 1000)):
        x, y = images(n, rng)
        rows = {
            "img": list(x),
            "label": y,
            "site": rng.integers(0, 4, n),
            "id": start + np.arange(n),
        }
        splits[split] = datasets.Dataset.from_dict(rows, features=features)
        for i, (a, c) in enumerate(zip(x, y, strict=True)):
            folder = root / "imagefolder" / split / CLASSES[c]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(a).save(folder / f"{i:04d}.png")
    datasets.disable_progress_bars()
    dd = datasets.DatasetDict(splits)
    dd.save_to_disk(str(root / "disk"))
    (root / "parquet").mkdir()
    for split, ds in dd.items():
        ds.to_parquet(str(root / "parquet" / f"{split}.parquet"))
    return {"root": root, **{k: root / k for k in ("disk", "parquet", "imagefolder")}}


def scenario(path: Path | str, **over) -> ScenarioConfig:
    base = {
        "dataset": "hf",
        "dataset_options": {"path": str(path)},
        "num_clients": 6,
        "label_shift": {"kind": "pathological", "classes_per_client": 2},
        "test_clients": {"enabled": False},
    }
    return ScenarioConfig.model_validate({**base, **over})


def source_of(data, client) -> np.ndarray:
    """Raw training indices of a client's training samples."""
    return data.origin[client.train_idx.numpy()]


def nhwc(x) -> np.ndarray:
    return x.permute(0, 2, 3, 1).numpy()


def by_bytes(x: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """``x`` (and arrays aligned with it) in the order of the images' bytes."""
    order = np.argsort([a.tobytes() for a in x], kind="stable")
    return (x[order], *(o[order] for o in others))


# ------------------------------------------------------------------------------ the source


def test_the_copies_load_to_the_same_arrays(hub):
    disk = load_dataset("hf", path=str(hub["disk"]), factor_columns=["site"])
    assert disk.x_train.shape == (240, 16, 16, 3) and disk.x_train.dtype == np.uint8
    assert disk.y_train.dtype == np.int64 and disk.classes == tuple(CLASSES)
    assert disk.x_test.shape == (80, 16, 16, 3) and len(disk.mean) == 3
    assert disk.factor_names == ("site",) and set(disk.factors_test["site"]) <= {0, 1, 2, 3}
    parquet = load_dataset("hf", path=str(hub["parquet"]), format="parquet")
    for a, b in [(disk.x_train, parquet.x_train), (disk.y_test, parquet.y_test)]:
        np.testing.assert_array_equal(a, b)
    # an image folder lists its files by class: the same images and labels, in another order
    folder = load_dataset("huggingface", hub["root"], path="imagefolder")
    assert folder.classes == tuple(CLASSES) and "imagefolder" in folder.source
    for split in ("train", "test"):
        want = by_bytes(getattr(disk, f"x_{split}"), getattr(disk, f"y_{split}"))
        got = by_bytes(getattr(folder, f"x_{split}"), getattr(folder, f"y_{split}"))
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_one_split_holds_a_seeded_stratified_test_fraction_out(hub):
    one = read_hub(path=str(hub["parquet"] / "train.parquet"), test_fraction=0.25, seed=3)
    assert (one.train_split, one.test_split) == ("train", "train")
    assert len(one.rows_train) + len(one.rows_test) == 240
    assert not set(one.rows_train) & set(one.rows_test)
    full = load_dataset("hf", path=str(hub["disk"]))
    np.testing.assert_array_equal(one.raw.x_train, full.x_train[one.rows_train])
    np.testing.assert_array_equal(one.raw.y_test, full.y_train[one.rows_test])
    per_class = np.bincount(one.raw.y_test, minlength=4) / np.bincount(full.y_train, minlength=4)
    assert np.allclose(per_class, 0.25, atol=0.03)
    again = read_hub(path=str(hub["disk"]), test_split="train", test_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again.rows_test, one.rows_test)  # same seed, same rows
    other = read_hub(path=str(hub["disk"]), test_split="train", test_fraction=0.25, seed=4)
    assert not np.array_equal(other.rows_test, one.rows_test)


def test_grayscale_sizes_and_channels(tmp_path):
    rng = np.random.default_rng(1)
    pics = [Image.fromarray(rng.integers(0, 255, (s, s), dtype=np.uint8)) for s in (8, 8, 12, 12)]
    ds = datasets.Dataset.from_dict({"image": pics, "label": [0, 1, 0, 1]})
    ds.save_to_disk(str(tmp_path / "gray"))
    with pytest.raises(FedshiftError, match=r"differ in size \(8x8, 12x12\).*image_size"):
        load_dataset("hf", path=str(tmp_path / "gray"))
    gray = load_dataset("hf", path=str(tmp_path / "gray"), image_size=10, test_fraction=0.5)
    assert gray.x_train.shape[1:] == (10, 10, 1) and gray.classes == ("0", "1")
    rgb = load_dataset(
        "hf", path=str(tmp_path / "gray"), image_size=[6, 9], channels=3, test_fraction=0.5
    )
    assert rgb.x_train.shape[1:] == (6, 9, 3)
    assert np.array_equal(rgb.x_train[..., 0], rgb.x_train[..., 2])


def test_errors_are_one_line_and_name_what_exists(hub, tmp_path):
    disk = str(hub["disk"])
    cases = [
        ({"path": disk, "image_column": "picture"}, r"no column 'picture'.*img, label, site, id"),
        ({"path": disk, "label_column": "lbl"}, r"no column 'lbl' \(label_column\)"),
        ({"path": disk, "factor_columns": ["room"]}, r"no column 'room'.*its columns"),
        ({"path": disk, "test_split": "validation"}, r"no split 'validation'.*splits: train, test"),
        ({"path": disk, "train_split": "all"}, r"no split 'all' \(train_split\)"),
        ({"path": disk, "label_column": "img"}, r"column 'img' \(label\) holds Image"),
        ({"path": str(tmp_path / "missing.parquet")}, r"does not exist \(looked under"),
        ({"path": "someone/not-cached-anywhere"}, r"offline.*give a local copy"),
        ({}, r"path is required"),
    ]
    for options, message in cases:
        with pytest.raises(FedshiftError, match=message) as info:
            load_dataset("hf", **options)
        assert "\n" not in str(info.value)
    with pytest.raises(DatasetNotFoundError):
        load_dataset("hf", path="someone/not-cached-anywhere")


def test_the_missing_package_is_named(hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(FedshiftError, match=r'pip install "fedshift\[hub\]"'):
        load_dataset("hf", path=str(hub["disk"]))


def test_fedshift_imports_neither_datasets_nor_flwr_datasets():
    code = (
        "import sys, fedshift, fedshift.data.scenario, fedshift.data.partition\n"
        "from fedshift.data.sources import dataset_names, dataset_options\n"
        "assert 'hf' in dataset_names() and 'image_column' in dataset_options('hf')\n"
        "print(sorted(m for m in ('datasets', 'flwr_datasets') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_scenario_hash_holds_the_options(hub):
    a = scenario(hub["disk"])
    b = scenario(hub["disk"], dataset_options={"path": str(hub["disk"]), "image_size": 8})
    c = scenario(hub["parquet"])
    assert len({a.hash(0), b.hash(0), c.hash(0)}) == 3


# ------------------------------------------------------------------------------ shifts


def test_label_feature_and_concept_shift_on_a_saved_dataset(hub):
    cfg = scenario(
        hub["disk"],
        concepts=["identity", "reverse"],
        mix={
            "clients": [
                {"concept": 0, "style": "clean"},
                {"concept": 0, "style": "rotate:90"},
                {"concept": 1, "style": "clean"},
                {"concept": 1, "style": "gaussian_noise/3"},
                {"concept": 0, "style": "color:red"},
                {"concept": 1, "style": "clean"},
            ]
        },
    )
    data = build_scenario(cfg, seed=0)
    raw = load_dataset("hf", path=str(hub["disk"]))
    hists = {tuple(c.label_hist) for c in data.clients}
    assert len(hists) > 1 and all((np.asarray(h) > 0).sum() <= 2 for h in hists)  # label shift
    for c in data.clients:
        src = source_of(data, c)
        pixels, before = nhwc(data.x[c.train_idx]), raw.x_train[src]
        if c.style.kind == "clean":
            np.testing.assert_array_equal(pixels, before)
        else:  # feature shift
            assert np.abs(pixels.astype(int) - before.astype(int)).mean() > 5, c.style.label()
        y_raw = raw.y_train[src]
        want = y_raw if c.concept == 0 else 3 - y_raw  # concept shift: reverse = C-1-y
        np.testing.assert_array_equal(c.y_train.numpy(), want)
    rotated = next(c for c in data.clients if c.style.kind == "rotate")
    src = source_of(data, rotated)
    turned = [np.rot90(raw.x_train[src], k, axes=(1, 2)) for k in (1, 3)]
    assert any(np.array_equal(nhwc(data.x[rotated.train_idx]), t) for t in turned)


def test_drift_on_a_parquet_copy(hub):
    cfg = scenario(
        hub["parquet"],
        concepts=["identity", "shift:1"],
        label_shift={"kind": "iid"},
        timeline={
            "rounds_per_step": 1,
            "assignment": "switch",
            "steps": [
                {"concepts": [0]},
                {"concepts": [0, 1], "switch": 0.5, "style": "rotate:180"},
            ],
        },
    )
    data = build_scenario(cfg, seed=0)
    raw = load_dataset("hf", path=str(hub["parquet"]))
    assert data.num_steps == 2 and any(c.drifted for c in data.steps[1])
    for c in data.steps[1]:
        src = source_of(data, c)
        np.testing.assert_array_equal(nhwc(data.x[c.train_idx]), raw.x_train[src][:, ::-1, ::-1])
        want = raw.y_train[src] if c.concept == 0 else (raw.y_train[src] + 1) % 4
        np.testing.assert_array_equal(c.y_train.numpy(), want)


def test_attribute_skew_by_a_factor_column(hub):
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "hf",
            "dataset_options": {"path": str(hub["disk"]), "factor_columns": ["site"]},
            "num_clients": 4,
            "attributes": {"kind": "factor", "factor": "site"},
        }
    )
    data = build_scenario(cfg, seed=0)
    raw = load_dataset("hf", path=str(hub["disk"]), factor_columns=["site"])
    pooled = np.concatenate([raw.x_train, raw.x_test])
    sites = np.concatenate([raw.factors_train["site"], raw.factors_test["site"]])
    site_of = {a.tobytes(): s for a, s in zip(pooled, sites, strict=True)}
    for k, c in enumerate(data.clients):
        held = {site_of[a.tobytes()] for a in nhwc(data.x[c.train_idx])}
        assert held == {k}, (k, held)  # 4 clients, 4 sites: client k holds site k only


# ------------------------------------------------------------------------------ flwr-datasets


def test_a_scenario_split_as_a_flower_partitioner(hub):
    cfg = scenario(
        hub["parquet"] / "train.parquet",  # one split: a test fraction is held out of it
        label_shift={"kind": "dirichlet", "alpha": 0.5},
        concepts=["identity", "reverse"],
        mix={"types": [{"fraction": 0.5, "concepts": [0]}, {"fraction": 0.5, "concepts": [1]}]},
    )
    part = ScenarioPartitioner.from_config(cfg, seed=1, label_column="client_label")
    part.dataset = datasets.load_dataset(
        "parquet",
        data_files=str(hub["parquet"] / "train.parquet"),
        cache_dir=str(hub["root"] / "c"),
    )["train"]
    assert part.num_partitions == 6
    held_out = set(read_hub(path=str(hub["parquet"] / "train.parquet")).rows_test)
    seen: set[int] = set()
    for i, client in enumerate(part.data.clients):
        rows = part.load_partition(i)
        ids = rows["id"][:]
        assert len(ids) == client.num_train and not set(ids) & (seen | held_out)
        seen |= set(ids)
        got = np.stack([np.asarray(im) for im in rows["img"]])
        want, want_y = by_bytes(nhwc(part.data.x[client.train_idx]), client.y_train.numpy())
        got, got_y = by_bytes(got, np.asarray(rows["client_label"][:]))
        np.testing.assert_array_equal(got, want)  # exactly the client's images
        np.testing.assert_array_equal(got_y, want_y)  # with its labels after its label map
    whole = ScenarioPartitioner(part.data, part.rows, part="all")
    assert all(
        len(whole.partition_rows(i)) == c.num_train + c.num_test
        for i, c in enumerate(part.data.clients)
    )


def test_the_flower_partitioner_in_a_federated_dataset(hub):
    cfg = scenario(hub["disk"], label_shift={"kind": "pathological", "classes_per_client": 1})
    part = ScenarioPartitioner.from_config(cfg, seed=0)
    fds = FederatedDataset(
        dataset=str(hub["parquet"]),
        shuffle=False,
        partitioners={"train": part},
        cache_dir=str(hub["root"] / "c"),
    )
    first = fds.load_partition(0, "train")
    assert list(first["id"][:]) == list(part.partition_rows(0))
    assert len(set(first["label"][:])) == 1  # one class per client
    shuffled = FederatedDataset(
        dataset=str(hub["parquet"]),
        partitioners={"train": ScenarioPartitioner(part.data, part.rows)},
        cache_dir=str(hub["root"] / "c"),
    )
    with pytest.raises(FedshiftError, match="shuffle=False"):
        shuffled.load_partition(0, "train")


def flwr_split(hub, partitioner, num: int) -> list[list[int]]:
    """What flwr-datasets itself makes of the training split: each partition's ids."""
    partitioner.dataset = datasets.load_from_disk(str(hub["disk"]))["train"]
    return [sorted(partitioner.load_partition(i)["id"][:]) for i in range(num)]


def test_a_flwr_partitioner_drives_a_run(hub, tiny):
    from fedshift.run.experiment import run_experiment

    options = {"alpha": 0.5, "seed": 7, "min_partition_size": 5}
    cfg = tiny(
        scenario={
            "dataset": "hf",
            "dataset_options": {"path": str(hub["disk"])},
            "num_clients": 4,
            "label_shift": {
                "kind": "flwr",
                "partitioner": "DirichletPartitioner",
                "options": options,
            },
        },
        model={"name": "mlp", "width": 32},
        train={"rounds": 2, "batch_size": 16, "lr": 0.05},
    )
    res = run_experiment(cfg)
    assert len(res.history) == 2 and "global_acc" in res.history[-1]
    direct = flwr_split(hub, DirichletPartitioner(4, "label", **options), 4)
    for c, ids in zip(res.data.clients, direct, strict=True):
        both = np.concatenate([c.train_idx.numpy(), c.test_idx.numpy()])
        assert sorted(res.data.origin[both].tolist()) == ids  # the same rows (ids = row here)


def test_a_flwr_pathological_partitioner_and_its_seed(hub):
    labels = load_dataset("hf", path=str(hub["disk"])).y_train
    opts = {"num_classes_per_partition": 2, "seed": 3}
    ours = make_partitioner("flwr", partitioner="pathological", options=opts)
    parts = ours.split(labels, 5, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == flwr_split(
        hub, PathologicalPartitioner(5, "label", **opts), 5
    )
    again = ours.split(labels, 5, np.random.default_rng(99))  # a given seed wins over the run's
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    drawn = make_partitioner(
        "flwr", partitioner="PathologicalPartitioner", options={"num_classes_per_partition": 2}
    )
    one, two = (drawn.split(labels, 5, np.random.default_rng(s)) for s in (0, 1))
    assert any(not np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(one, drawn.split(labels, 5, np.random.default_rng(0)), strict=True)
    )


def test_flwr_kind_errors(hub):
    labels = np.repeat(np.arange(4), 10)
    rng = np.random.default_rng(0)
    with pytest.raises(
        ConfigError,
        match=r"unknown flwr-datasets partitioner 'Dirichlet2'.*"
        r"did you mean.*available: .*DirichletPartitioner.*PathologicalPartitioner",
    ):
        make_partitioner("flwr", partitioner="Dirichlet2").split(labels, 4, rng)
    with pytest.raises(ConfigError, match=r"num_partitions=3 differs from scenario.num_clients=4"):
        make_partitioner("flwr", partitioner="iid", options={"num_partitions": 3}).split(
            labels, 4, rng
        )
    with pytest.raises(ConfigError, match=r"IidPartitioner takes no 'alpha'"):
        make_partitioner("flwr", partitioner="iid", options={"alpha": 1}).split(labels, 4, rng)
    with pytest.raises(ConfigError, match=r"client\(s\) .* no sample"):
        opts = {"partition_sizes": [40, 0, 0, 0], "alpha": 1.0}
        make_partitioner("flwr", partitioner="InnerDirichlet", options=opts).split(labels, 4, rng)
    with pytest.raises(ValueError, match="kind=flwr needs a partitioner"):
        ScenarioConfig.model_validate({"label_shift": {"kind": "flwr"}})
    with pytest.raises(ValueError, match="alpha is not used with kind=flwr"):
        ScenarioConfig.model_validate(
            {"label_shift": {"kind": "flwr", "partitioner": "iid", "alpha": 0.3}}
        )
    cfg = validate_config(
        {"scenario": {"label_shift": {"kind": "flwr", "partitioner": "iid"}}, "device": "cpu"}
    )
    assert cfg.scenario.label_shift.params() == {"partitioner": "iid"}


def test_model_auto_on_a_hub_dataset_asks_for_a_model(hub, tiny):
    from fedshift.core.errors import ConfigError
    from fedshift.run.experiment import model_name

    cfg = tiny(scenario={"dataset": "hf", "dataset_options": {"path": str(hub["disk"])}})
    cfg.model.name = "auto"
    with pytest.raises(ConfigError, match="no usual model for dataset 'hf'; name one"):
        model_name(cfg)
    cfg.model.name = "lenet_small"
    assert model_name(cfg) == "lenet_small"
