"""Tests for fedshift.data.sources: formats, lookup, caching and errors (no network needed)."""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedshift.core.errors import DatasetNotFoundError, FedshiftError, UnknownNameError
from fedshift.core.registry import Registry
from fedshift.data import sources
from fedshift.data.sources import (
    RawDataset,
    dataset_names,
    formats,
    load_dataset,
    lookup,
    read_idx,
    search_dirs,
)

# Captured before the autouse fixture below removes it from the environment.
REAL_DATA = os.environ.get("FEDSHIFT_DATA", "").strip() or None


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from real system/home/cache directories."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FEDSHIFT_DATA", raising=False)
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(lookup, "SYSTEM_DATA_DIRS", (tmp_path / "system",))
    return tmp_path


# ------------------------------------------------------------------------------------------
# helpers writing tiny files in the real formats


def idx_bytes(arr: np.ndarray) -> bytes:
    header = b"\x00\x00\x08" + bytes([arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_idx_set(folder: Path, gz: bool, n_train: int = 20, n_test: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(n_train, dtype=np.uint8) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test, dtype=np.uint8) * 3) % 10,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for stem, arr in arrays.items():
        data = idx_bytes(arr)
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)
    return arrays


def chw_rows(images_hwc: np.ndarray) -> np.ndarray:
    return images_hwc.transpose(0, 3, 1, 2).reshape(len(images_hwc), -1)


def write_cifar10_pickles(folder: Path, per_batch: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        y = list(rng.integers(0, 10, per_batch))
        with (folder / name).open("wb") as f:
            pickle.dump({b"data": chw_rows(x), b"labels": y, b"batch_label": name.encode()}, f)
        xs.append(x)
        ys.append(y)
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f)
    return np.concatenate(xs), np.concatenate(ys)


def jpeg_bytes(color: tuple[int, int, int] | int, size: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (size, size), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (200, 200, 40), (10, 10, 10)]


def write_cifar10_npz(path: Path) -> dict[str, np.ndarray]:
    parts: dict[str, np.ndarray] = {}
    for split, n in (("train", 7), ("test", 4)):
        blobs = [jpeg_bytes(COLORS[i % len(COLORS)], 32) for i in range(n)]
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
        parts[f"{split}_jpeg"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        parts[f"{split}_offsets"] = offsets
        parts[f"{split}_labels"] = (np.arange(n) % len(COLORS)).astype(np.uint8)
    parts["classes"] = np.array(
        ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **parts)
    return parts


def write_tiny_imagenet(root: Path) -> Path:
    folder = root / "tiny-imagenet-200"
    wnids = ["n02000002", "n01000001"]  # deliberately unsorted
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "words.txt").write_text(
        "n01000001\tgoldfish, Carassius auratus\nn02000002\ttabby, tabby cat\nn09999999\tunused\n"
    )
    for k, w in enumerate(wnids):
        img_dir = folder / "train" / w / "images"
        img_dir.mkdir(parents=True)
        (folder / "train" / w / f"{w}_boxes.txt").write_text("")
        for j in range(3):
            name = img_dir / f"{w}_{j}.JPEG"
            if k == 0 and j == 2:
                name.write_bytes(jpeg_bytes(128, 64, mode="L"))  # a grayscale image
            else:
                name.write_bytes(jpeg_bytes(COLORS[k], 64))
    val = folder / "val" / "images"
    val.mkdir(parents=True)
    lines = []
    for i, w in enumerate(["n01000001", "n02000002", "n01000001"]):
        (val / f"val_{i}.JPEG").write_bytes(jpeg_bytes(COLORS[3], 64))
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder


def decoded_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "decoded").glob("*.npz"))


# ------------------------------------------------------------------------------------------
# names


def test_dataset_names_and_aliases() -> None:
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
    for alias in ("fashion-mnist", "fashion_mnist", "FashionMNIST", "FMNIST", " fmnist "):
        assert sources.resolve_name(alias) == "fmnist"
    assert sources.resolve_name("Tiny-ImageNet") == "tinyimagenet"
    assert sources.resolve_name("CIFAR10") == "cifar10"


def test_dataset_names_order_when_a_source_is_imported_first() -> None:
    code = (
        "import fedshift.data.sources.synthetic, fedshift.data.sources.cifar100\n"
        "from fedshift.data.sources import dataset_names\n"
        "print(','.join(dataset_names()))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == [
        "fmnist,mnist,cifar10,cifar100,tinyimagenet,digits,synthetic,sea,sine,circle,"
        "digit-domains,dsprites,3dshapes,office-caltech10,domainnet,hf"
    ]


def test_unknown_name() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_dataset("imagenet-21k", download=False)
    assert info.value.kind == "dataset"
    assert set(info.value.allowed) == set(dataset_names())
    assert "fmnist" in str(info.value)


def test_sources_are_registry_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(sources.DATASETS, Registry)
    assert sources.dataset_options("synthetic") == (
        "num_classes",
        "dim",
        "n_train",
        "n_test",
        "separation",
        "seed",
    )
    assert sources.dataset_options("digits") == ("seed", "test_size")
    assert sources.dataset_options("Fashion-MNIST") == ()

    # load_dataset dispatches through the registry only: a new entry is a new dataset
    plugins: Registry = Registry("dataset")
    calls = []

    @plugins.register("toy", "toy-set")
    def load_toy(data_dir: Path | None, download: bool, *, size: int = 2) -> RawDataset:
        calls.append((data_dir, download, size))
        x, y = np.zeros((size, 3), np.float32), np.zeros(size, np.int64)
        return RawDataset("toy", x, y, x, y, 1, ("a",), (), (), "test")

    monkeypatch.setattr(sources, "DATASETS", plugins)
    assert dataset_names() == ["toy"]
    assert load_dataset("Toy-Set", "/nowhere", download=False, size=4).x_train.shape == (4, 3)
    assert calls == [("/nowhere", False, 4)]
    with pytest.raises(FedshiftError, match="does not accept option.*colour; allowed: size"):
        load_dataset("toy", colour=1)
    with pytest.raises(UnknownNameError, match="allowed: toy"):
        load_dataset("fmnist")


# ------------------------------------------------------------------------------------------
# IDX


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("sub", ["fashion-mnist", "fmnist", "FashionMNIST/raw", "."])
def test_fmnist_idx(tmp_path: Path, gz: bool, sub: str) -> None:
    data = tmp_path / "data"
    arrays = write_idx_set(data / sub, gz=gz)
    ds = load_dataset("Fashion-MNIST", data, download=False)
    assert ds.name == "fmnist" and ds.is_image
    assert ds.x_train.shape == (20, 28, 28, 1) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (10, 28, 28, 1)
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])
    assert ds.num_classes == 10 and ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot"
    assert ds.mean == (0.2860,) and ds.std == (0.3530,)
    assert Path(ds.source) == (data / sub if sub != "." else data)


def test_mnist_idx_layouts(tmp_path: Path) -> None:
    write_idx_set(tmp_path / "d1" / "mnist" / "raw", gz=False)
    write_idx_set(tmp_path / "d2" / "MNIST" / "raw", gz=True, seed=5)
    for d in ("d1", "d2"):
        ds = load_dataset("mnist", tmp_path / d, download=False)
        assert ds.x_train.shape == (20, 28, 28, 1)
        assert ds.mean == (0.1307,) and ds.classes == tuple("0123456789")


def test_mixed_plain_and_gz(tmp_path: Path) -> None:
    folder = tmp_path / "fashion-mnist"
    arrays = write_idx_set(folder, gz=True)
    gz_file = folder / "t10k-images-idx3-ubyte.gz"
    (folder / "t10k-images-idx3-ubyte").write_bytes(gzip.decompress(gz_file.read_bytes()))
    gz_file.unlink()
    ds = load_dataset("fmnist", tmp_path, download=False)
    np.testing.assert_array_equal(ds.x_test[..., 0], arrays["t10k-images-idx3-ubyte"])


def test_read_idx_roundtrip(tmp_path: Path) -> None:
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a").write_bytes(idx_bytes(arr))
    (tmp_path / "b.gz").write_bytes(gzip.compress(idx_bytes(arr)))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "b.gz"), arr)


def test_corrupt_idx(tmp_path: Path) -> None:
    folder = tmp_path / "fashion-mnist"
    write_idx_set(folder, gz=False)
    target = folder / "train-images-idx3-ubyte"
    target.write_bytes(target.read_bytes()[:-100])  # truncated data
    with pytest.raises(FedshiftError, match="corrupt") as info:
        load_dataset("fmnist", tmp_path, download=False)
    assert "train-images-idx3-ubyte" in str(info.value)

    (tmp_path / "bad").write_bytes(b"\x12\x34\x56\x78" + bytes(16))
    with pytest.raises(FedshiftError, match="magic"):
        read_idx(tmp_path / "bad")
    (tmp_path / "trunc.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((3, 4), np.uint8)))[:-9])
    with pytest.raises(FedshiftError):
        read_idx(tmp_path / "trunc.gz")


def test_wrong_idx_dims(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    write_idx_set(folder, gz=False)
    (folder / "train-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((20, 27, 28), np.uint8)))
    with pytest.raises(FedshiftError, match=r"\[N, 28, 28\]"):
        load_dataset("mnist", tmp_path, download=False)
    write_idx_set(folder, gz=False)
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(9, np.uint8)))
    with pytest.raises(FedshiftError, match="labels"):
        load_dataset("mnist", tmp_path, download=False)


# ------------------------------------------------------------------------------------------
# lookup order and not-found errors


def test_search_dirs_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(os.environ["HOME"])
    cache_data = tmp_path / "cache" / "data"
    rest = [tmp_path / "system", cache_data, home / "data"]
    assert search_dirs(None) == rest
    monkeypatch.setenv("FEDSHIFT_DATA", str(tmp_path / "env"))
    assert search_dirs(None) == [tmp_path / "env", *rest]
    assert search_dirs(tmp_path / "explicit") == [tmp_path / "explicit", *rest]
    monkeypatch.delenv("FEDSHIFT_CACHE")
    assert home / ".cache" / "fedshift" / "data" in search_dirs(None)


def test_lookup_env_system_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_idx_set(tmp_path / "system" / "fashion-mnist", gz=True)
    assert load_dataset("fmnist", download=False).source == str(
        tmp_path / "system" / "fashion-mnist"
    )
    write_idx_set(tmp_path / "env" / "fmnist", gz=True)
    monkeypatch.setenv("FEDSHIFT_DATA", str(tmp_path / "env"))
    assert load_dataset("fmnist", download=False).source == str(tmp_path / "env" / "fmnist")
    home_data = Path(os.environ["HOME"]) / "data" / "mnist"
    write_idx_set(home_data, gz=False)
    assert load_dataset("mnist", download=False).source == str(home_data)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("fmnist", "apt-get install dataset-fashion-mnist"),
        ("mnist", "mnist/raw/train-images-idx3-ubyte.gz"),
        ("cifar10", "cifar10-jpeg/cifar10-jpeg.npz"),
        ("cifar100", "cifar-100-python"),
        ("tinyimagenet", "tiny-imagenet-200"),
    ],
)
def test_missing_dataset_message(tmp_path: Path, name: str, hint: str) -> None:
    data = tmp_path / "nothing-here"
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, data, download=False)
    msg = str(info.value)
    for d in search_dirs(data):
        assert str(d) in msg
    assert str(tmp_path / "system") in msg and str(Path(os.environ["HOME"]) / "data") in msg
    assert hint in msg and "FEDSHIFT_DATA" in msg and "download=False" in msg


def test_failed_download_falls_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Make the lazy torchvision import fail: the error must be caught and reported.
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(DatasetNotFoundError, match="download failed"):
        load_dataset("fmnist", tmp_path / "none", download=True)


def test_module_does_not_import_torch() -> None:
    code = "import sys, fedshift.data.sources; assert 'torch' not in sys.modules, 'torch'"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


# ------------------------------------------------------------------------------------------
# CIFAR


def test_cifar10_pickles(tmp_path: Path) -> None:
    x, y = write_cifar10_pickles(tmp_path / "cifar-10-batches-py")
    ds = load_dataset("cifar10", tmp_path, download=False)
    assert ds.x_train.shape == (15, 32, 32, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (3, 32, 32, 3) and ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train, x[:15])  # CHW rows -> HWC images
    np.testing.assert_array_equal(ds.x_test, x[15:])
    np.testing.assert_array_equal(ds.y_train, y[:15])
    assert ds.classes[1] == "automobile" and ds.num_classes == 10
    assert ds.mean == (0.4914, 0.4822, 0.4465) and ds.std == (0.2023, 0.1994, 0.2010)
    assert "pickles" in ds.source


def test_cifar100_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    xs = {}
    for split, n in (("train", 6), ("test", 4)):
        xs[split] = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        with (folder / split).open("wb") as f:
            pickle.dump(
                {
                    b"data": chw_rows(xs[split]),
                    b"fine_labels": [99, 0, 5, 7, 1, 2][:n],
                    b"coarse_labels": [0] * n,
                },
                f,
            )
    with (folder / "meta").open("wb") as f:
        pickle.dump(
            {
                b"fine_label_names": [f"c{i}".encode() for i in range(100)],
                b"coarse_label_names": [b"x"] * 20,
            },
            f,
        )
    ds = load_dataset("CIFAR100", tmp_path, download=False)
    assert ds.num_classes == 100 and ds.classes[99] == "c99"
    assert ds.x_train.shape == (6, 32, 32, 3) and ds.x_test.shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(ds.x_test, xs["test"])
    assert ds.y_train.tolist() == [99, 0, 5, 7, 1, 2] and ds.y_train.dtype == np.int64
    assert ds.mean == (0.5071, 0.4865, 0.4409)


def test_cifar10_jpeg_npz_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = write_cifar10_npz(tmp_path / "data" / "cifar10-jpeg" / "cifar10-jpeg.npz")
    ds = load_dataset("cifar10", tmp_path / "data", download=False)
    assert "JPEG-derived CIFAR-10" in ds.source and "cifar10-jpeg npz" in ds.source
    assert ds.x_train.shape == (7, 32, 32, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (4, 32, 32, 3)
    assert ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.y_train, parts["train_labels"])
    for img, label in zip(ds.x_train, ds.y_train, strict=True):
        assert np.abs(img.astype(int) - np.array(COLORS[label])).max() <= 6
    assert ds.classes == tuple(parts["classes"].tolist())

    cached = decoded_files(tmp_path)
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns

    def no_decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded again instead of using the cache")

    monkeypatch.setattr(formats, "decode_jpeg_images", no_decode)
    again = load_dataset("cifar10", tmp_path / "data", download=False)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    np.testing.assert_array_equal(again.y_test, ds.y_test)
    assert decoded_files(tmp_path) == cached and cached[0].stat().st_mtime_ns == mtime
    assert not list(cached[0].parent.glob("*.tmp"))


def test_cifar10_prefers_pickles(tmp_path: Path) -> None:
    write_cifar10_npz(tmp_path / "cifar10-jpeg" / "cifar10-jpeg.npz")
    write_cifar10_pickles(tmp_path / "cifar-10-batches-py")
    ds = load_dataset("cifar10", tmp_path, download=False)
    assert "pickles" in ds.source and ds.x_train.shape[0] == 15


def test_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    write_cifar10_npz(tmp_path / "cifar10-jpeg" / "cifar10-jpeg.npz")
    load_dataset("cifar10", tmp_path, download=False)
    [cached] = decoded_files(tmp_path)
    cached.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unreadable cache"):
        ds = load_dataset("cifar10", tmp_path, download=False)
    assert ds.x_train.shape == (7, 32, 32, 3)
    assert cached.stat().st_size > 1000


# ------------------------------------------------------------------------------------------
# Tiny-ImageNet


def test_tiny_imagenet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny_imagenet(tmp_path / "data")
    ds = load_dataset("tiny-imagenet", tmp_path / "data", download=False)
    assert ds.name == "tinyimagenet"
    assert ds.x_train.shape == (6, 64, 64, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (3, 64, 64, 3)
    assert ds.num_classes == 2 and ds.classes == ("goldfish", "tabby")  # sorted wnids
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1] and ds.y_train.dtype == np.int64
    assert ds.y_test.tolist() == [0, 1, 0]
    gray = ds.x_train[5]  # n02000002_2.JPEG, the grayscale one
    assert np.abs(gray.astype(int) - 128).max() <= 3
    assert np.abs(ds.x_train[3].astype(int) - np.array(COLORS[0])).max() <= 6
    assert ds.mean == (0.4802, 0.4481, 0.3975)

    [cached] = decoded_files(tmp_path)
    mtime = cached.stat().st_mtime_ns
    monkeypatch.setattr(formats, "decode_jpeg_images", lambda *a, **k: 1 / 0)
    again = load_dataset("tinyimagenet", tmp_path / "data", download=False)
    np.testing.assert_array_equal(again.x_test, ds.x_test)
    assert cached.stat().st_mtime_ns == mtime


def test_tiny_imagenet_bad_annotation(tmp_path: Path) -> None:
    folder = write_tiny_imagenet(tmp_path)
    (folder / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn07777777\t0\t0\t1\t1\n")
    with pytest.raises(FedshiftError, match="val_annotations"):
        load_dataset("tinyimagenet", tmp_path, download=False)


# ------------------------------------------------------------------------------------------
# digits and synthetic


def test_digits() -> None:
    a = load_dataset("digits")
    b = load_dataset("DIGITS", download=False)
    assert a.x_train.shape == (1437, 8, 8, 1) and a.x_test.shape == (360, 8, 8, 1)
    assert a.x_train.dtype == np.uint8 and a.y_train.dtype == np.int64
    assert a.x_train.max() == 255 and a.x_train.min() == 0
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    counts = np.bincount(a.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified
    assert 0.0 < a.mean[0] < 1.0 and 0.0 < a.std[0] < 1.0 and len(a.mean) == 1
    assert a.source == "scikit-learn" and a.is_image


def test_synthetic() -> None:
    a = load_dataset("synthetic")
    assert a.x_train.shape == (6000, 32) and a.x_test.shape == (2000, 32)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert a.num_classes == 10 and len(a.classes) == 10 and not a.is_image
    assert a.mean == () and a.std == () and a.source == "generated"
    b = load_dataset("synthetic")
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    c = load_dataset("synthetic", seed=1)
    assert not np.array_equal(a.x_train, c.x_train)

    d = load_dataset("synthetic", num_classes=3, dim=5, n_train=300, n_test=90, separation=8.0)
    assert d.x_train.shape == (300, 5) and d.x_test.shape == (90, 5) and d.num_classes == 3
    assert set(d.y_train.tolist()) == {0, 1, 2}
    centers = np.stack([d.x_train[d.y_train == k].mean(0) for k in range(3)])
    dists = [np.linalg.norm(centers[i] - centers[j]) for i in range(3) for j in range(i + 1, 3)]
    assert 6.5 < float(np.mean(dists)) < 9.5


def test_bad_options() -> None:
    with pytest.raises(FedshiftError, match="colour") as info:
        load_dataset("synthetic", colour=3)
    assert "num_classes" in str(info.value) and "separation" in str(info.value)
    with pytest.raises(FedshiftError, match="dim"):
        load_dataset("fmnist", dim=3, download=False)
    with pytest.raises(FedshiftError, match="dim"):
        load_dataset("synthetic", dim=0)
    with pytest.raises(FedshiftError, match="separation"):
        load_dataset("synthetic", separation=-1.0)


def test_raw_dataset_is_frozen() -> None:
    ds = load_dataset("synthetic", n_train=10, n_test=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        RawDataset(
            "x",
            np.zeros((2, 3)),
            np.zeros(3, np.int64),
            np.zeros((1, 3)),
            np.zeros(1, np.int64),
            1,
            ("a",),
            (),
            (),
            "generated",
        )


# ------------------------------------------------------------------------------------------
# the real data (CI sets FEDSHIFT_DATA to the shared data folder)


needs_real_data = pytest.mark.skipif(
    REAL_DATA is None and not os.environ.get("CI"),
    reason="FEDSHIFT_DATA is not set (CI sets it, and there these tests must run)",
)


def real_data_dir() -> Path:
    if REAL_DATA is None:  # only reachable under CI: the skipif above lets these run there
        pytest.fail("FEDSHIFT_DATA must point to the shared data folder when CI is set")
    return Path(REAL_DATA)


@needs_real_data
def test_real_fashion_mnist_and_mnist() -> None:
    data = real_data_dir()
    fm = load_dataset("fmnist", data, download=False)
    assert fm.x_train.shape == (60000, 28, 28, 1) and fm.x_test.shape == (10000, 28, 28, 1)
    assert fm.x_train.dtype == np.uint8
    assert np.bincount(fm.y_train).tolist() == [6000] * 10
    assert np.bincount(fm.y_test).tolist() == [1000] * 10
    assert abs(fm.x_train.mean() / 255 - 0.2860) < 1e-3

    mn = load_dataset("mnist", data, download=False)  # train images: a recompressed .gz
    assert mn.x_train.shape == (60000, 28, 28, 1) and mn.x_test.shape == (10000, 28, 28, 1)
    assert sorted(set(mn.y_train.tolist())) == list(range(10))
    assert abs(mn.x_train.mean() / 255 - 0.1307) < 1e-3


@needs_real_data
def test_real_cifar10_jpeg(tmp_path: Path) -> None:
    data = real_data_dir()
    ds = load_dataset("cifar10", data, download=False)  # FEDSHIFT_CACHE is under tmp_path
    assert ds.x_train.shape == (50000, 32, 32, 3) and ds.x_test.shape == (10000, 32, 32, 3)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert np.bincount(ds.y_train).tolist() == [5000] * 10
    assert ds.classes[0] == "airplane"
    if "JPEG-derived" in ds.source:
        assert len(decoded_files(tmp_path)) == 1
