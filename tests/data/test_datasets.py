"""Tests of pyro_invariance.data.images and pyro_invariance.data.idx (all offline, small)."""

from __future__ import annotations

import gzip
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_invariance.data.idx import read_idx
from pyro_invariance.data.images import (
    BASES,
    DEFAULT_FASHION_MNIST_DIR,
    TEST_SEED,
    TRAIN_SEED,
    VARIANTS,
    ImageDataset,
    dataset_name,
    list_datasets,
    load_dataset,
    warp_images,
)
from pyro_invariance.registry import DATASETS, UnknownNameError

torch.set_num_threads(1)

_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzipped when ``path`` ends in .gz), independently of read_idx."""
    header = struct.pack(">HBB", 0, _IDX_CODES[array.dtype], array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


def write_mnist_like(folder: Path, n_train: int = 20, n_test: int = 10, gz: bool = False, seed: int = 0) -> dict:
    """Tiny random 28×28 IDX files with MNIST's file names; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for stem, array in arrays.items():
        write_idx(folder / (stem + (".gz" if gz else "")), array)
    return arrays


# ------------------------------------------------------------------------------------------ digits


def test_digits_shapes_ranges_and_classes():
    d = load_dataset("digits")
    assert isinstance(d, ImageDataset) and d.name == "digits"
    assert d.x_train.shape == (1347, 1, 8, 8) and d.x_test.shape == (450, 1, 8, 8)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.image_shape == (1, 8, 8) and d.input_dim == 64 and d.num_classes == 10
    for x in (d.x_train, d.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(d.y_train.tolist()) == set(range(10)) and set(d.y_test.tolist()) == set(range(10))
    # stratified: each class contributes a quarter of its examples to the test split
    total = torch.cat([d.y_train, d.y_test]).bincount()
    assert (d.y_test.bincount() - 0.25 * total).abs().max() <= 1
    assert d.info["variant"] == "regular" and "train_params" not in d.info
    assert "digits" in repr(d) and "1347" in repr(d)


def test_determinism_and_prefix_subsets():
    a = load_dataset("rotated-digits")
    b = load_dataset("rotated-digits")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_test, b.x_test)
    assert torch.equal(a.info["train_params"], b.info["train_params"])
    small = load_dataset("rotated-digits", train_size=100, test_size=30)
    assert small.x_train.shape[0] == 100 and small.x_test.shape[0] == 30
    assert torch.equal(small.info["train_params"], a.info["train_params"][:100])
    assert torch.equal(small.info["test_params"], a.info["test_params"][:30])
    torch.testing.assert_close(small.x_train, a.x_train[:100], atol=1e-6, rtol=0)
    assert torch.equal(small.y_train, a.y_train[:100])


def test_train_and_test_seeds_differ():
    d = load_dataset("rotated-digits", train_size=200, test_size=200)
    assert d.info["train_seed"] == TRAIN_SEED and d.info["test_seed"] == TEST_SEED and TRAIN_SEED != TEST_SEED
    assert not torch.allclose(d.info["train_params"], d.info["test_params"])


def test_rotated_digits_differ_from_upright_with_same_labels():
    upright = load_dataset("digits")
    rotated = load_dataset("rotated-digits")
    assert torch.equal(upright.y_train, rotated.y_train) and torch.equal(upright.y_test, rotated.y_test)
    assert rotated.x_train.shape == upright.x_train.shape
    per_image = (rotated.x_train - upright.x_train).abs().flatten(1).amax(1)
    assert (per_image > 0.1).float().mean() > 0.9
    assert 0.0 <= float(rotated.x_train.min()) and float(rotated.x_train.max()) <= 1.0
    assert rotated.info["param_names"] == ("rot",)


def test_zero_parameters_are_the_identity():
    spec = VARIANTS["rotated"]
    m = spec.matrices(torch.zeros(5, 1, dtype=torch.float64))
    torch.testing.assert_close(m, torch.eye(3, dtype=torch.float64).expand(5, 3, 3))
    x = load_dataset("digits", train_size=5).x_train
    torch.testing.assert_close(warp_images(x, m), x, atol=1e-6, rtol=0)


def test_rotated_angles_cover_full_circle():
    theta = load_dataset("rotated-digits").info["train_params"][:, 0]
    assert float(theta.abs().max()) <= math.pi
    assert float(theta.min()) < -0.95 * math.pi and float(theta.max()) > 0.95 * math.pi
    assert abs(float(theta.mean())) < 0.2


def test_partially_rotated_within_half_pi():
    d = load_dataset("partially-rotated-digits")
    for key in ("train_params", "test_params"):
        theta = d.info[key][:, 0]
        assert float(theta.abs().max()) <= math.pi / 2
        assert float(theta.abs().max()) > 0.45 * math.pi


def test_translated_and_scaled_parameters():
    t = load_dataset("translated-digits", train_size=300)
    p = t.info["train_params"]
    assert p.shape == (300, 2) and t.info["param_names"] == ("tx", "ty")
    assert float(p.abs().max()) <= 8 / 14 and float(p.abs().max()) > 0.5
    assert abs(float(torch.corrcoef(p.T)[0, 1])) < 0.2  # independent shifts
    s = load_dataset("scaled-digits", train_size=300)
    logs = s.info["train_params"][:, 0]
    assert float(logs.abs().max()) <= math.log(2.0)
    m = VARIANTS["scaled"].matrices(s.info["train_params"])
    torch.testing.assert_close(m[:, 0, 0], logs.exp())
    torch.testing.assert_close(m[:, 1, 1], logs.exp())  # isotropic: sx = sy
    assert float(m[:, 0, 1].abs().max()) == 0.0 and float(m[:, :2, 2].abs().max()) == 0.0


# ------------------------------------------------------------------------------------------ registry


def test_registry_names_and_unknown_name():
    names = list_datasets()
    assert names == DATASETS.names()
    assert {dataset_name(b, v) for b in BASES for v in VARIANTS} <= set(names)  # 4 bases x 5 variants
    expected = ("digits", "rotated-digits", "partially-rotated-fashion-mnist", "translated-mnist", "scaled-cifar10")
    assert set(expected) <= set(names)
    assert DATASETS.get("digits", train_size=10).x_train.shape[0] == 10
    with pytest.raises(UnknownNameError) as err:
        load_dataset("rotated-digit")
    assert "rotated-digits" in str(err.value) and "scaled-cifar10" in str(err.value)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "10", 1348])
def test_invalid_train_size(bad):
    with pytest.raises(ValueError, match="train_size"):
        load_dataset("digits", train_size=bad)


def test_invalid_test_size():
    with pytest.raises(ValueError, match="test_size"):
        load_dataset("digits", test_size=451)


# ------------------------------------------------------------------------------------------ container


def _tiny(**overrides) -> dict:
    kw = dict(
        name="tiny",
        x_train=torch.rand(4, 1, 3, 3),
        y_train=torch.tensor([0, 1, 2, 1]),
        x_test=torch.rand(2, 1, 3, 3),
        y_test=torch.tensor([0, 2]),
        num_classes=3,
    )
    kw.update(overrides)
    return kw


def test_image_dataset_validation():
    d = ImageDataset(**_tiny())
    assert d.image_shape == (1, 3, 3) and d.input_dim == 9 and d.info == {}
    moved = d.to("cpu")
    assert torch.equal(moved.x_train, d.x_train) and moved.name == "tiny"
    x = torch.rand(4, 1, 3, 3)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ImageDataset(**_tiny(x_train=x))
    with pytest.raises(ValueError, match="outside"):
        ImageDataset(**_tiny(y_test=torch.tensor([0, 3])))
    with pytest.raises(ValueError, match="labels"):
        ImageDataset(**_tiny(y_train=torch.tensor([0, 1, 2])))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        ImageDataset(**_tiny(x_train=torch.rand(4, 3, 3)))
    with pytest.raises(ValueError, match="differ"):
        ImageDataset(**_tiny(x_test=torch.rand(2, 1, 4, 4)))
    with pytest.raises(ValueError, match="integer"):
        ImageDataset(**_tiny(y_train=torch.zeros(4)))
    with pytest.raises(ValueError, match="num_classes"):
        ImageDataset(**_tiny(num_classes=0))


# ------------------------------------------------------------------------------------------ IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, suffix):
    images = np.random.default_rng(1).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    back = read_idx(write_idx(tmp_path / f"images{suffix}", images))
    assert back.dtype == np.uint8 and np.array_equal(back, images)
    ints = np.array([-5, 0, 70000], dtype=np.int32)
    back = read_idx(write_idx(tmp_path / f"ints{suffix}", ints))
    assert back.dtype == np.int32 and np.array_equal(back, ints)


def test_corrupt_idx_raises_value_error_naming_file(tmp_path):
    good = write_idx(tmp_path / "good", np.zeros((3, 4, 4), dtype=np.uint8)).read_bytes()
    cases = {
        "truncated": good[:-5],
        "trailing": good + b"\x00",
        "badmagic": b"\x01\x02" + good[2:],
        "badtype": good[:2] + b"\x42" + good[3:],
        "tiny": b"\x00\x00",
        "shortheader": good[:9],
    }
    for label, payload in cases.items():
        path = tmp_path / f"{label}-idx3-ubyte"
        path.write_bytes(payload)
        with pytest.raises(ValueError, match=label):
            read_idx(path)
    broken_gz = tmp_path / "broken-idx3-ubyte.gz"
    broken_gz.write_bytes(gzip.compress(good)[:-12])
    with pytest.raises(ValueError, match="broken-idx3-ubyte.gz"):
        read_idx(broken_gz)
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "absent")


# ------------------------------------------------------------------------------------------ fashion-mnist


def test_fashion_mnist_missing_dir_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion-mnist", data_dir=tmp_path / "nowhere")
    assert "apt-get install dataset-fashion-mnist" in str(err.value) and "--data-dir" in str(err.value)


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_mnist_from_written_idx_files(tmp_path, gz):
    arrays = write_mnist_like(tmp_path, gz=gz)
    d = load_dataset("rotated-fashion-mnist", data_dir=tmp_path, train_size=12)
    assert d.x_train.shape == (12, 1, 28, 28) and d.x_test.shape == (10, 1, 28, 28)
    assert d.y_train.tolist() == arrays["train-labels-idx1-ubyte"][:12].tolist()
    upright = load_dataset("fashion-mnist", root=tmp_path)
    expected = torch.from_numpy(arrays["t10k-images-idx3-ubyte"]).float().div(255).unsqueeze(1)
    assert torch.equal(upright.x_test, expected)


def test_fashion_mnist_corrupt_file_is_named(tmp_path):
    write_mnist_like(tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte"):
        load_dataset("fashion-mnist", data_dir=tmp_path)


@pytest.mark.skipif(
    not DEFAULT_FASHION_MNIST_DIR.exists(), reason="Debian package dataset-fashion-mnist is not installed"
)
def test_fashion_mnist_real_files():
    d = load_dataset("fashion-mnist", train_size=100, test_size=50)
    assert d.x_train.shape == (100, 1, 28, 28) and d.x_test.shape == (50, 1, 28, 28)
    assert d.info["available_train"] == 60000 and d.info["available_test"] == 10000
    assert 0.0 <= float(d.x_train.min()) and float(d.x_train.max()) <= 1.0 and float(d.x_train.max()) > 0.9
    assert d.num_classes == 10 and len(d.info["classes"]) == 10


# ------------------------------------------------------------------------------------------ torchvision


def test_mnist_via_torchvision_on_tiny_idx_files(tmp_path):
    arrays = write_mnist_like(tmp_path / "MNIST" / "raw", seed=3)
    d = load_dataset("mnist", data_dir=tmp_path)
    assert d.x_train.shape == (20, 1, 28, 28) and d.x_test.shape == (10, 1, 28, 28)
    expected = torch.from_numpy(arrays["train-images-idx3-ubyte"]).float().div(255).unsqueeze(1)
    assert torch.equal(d.x_train, expected)
    assert d.y_test.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    r = load_dataset("translated-mnist", root=tmp_path, train_size=5)
    assert r.x_train.shape == (5, 1, 28, 28) and r.info["train_params"].shape == (5, 2)


def test_mnist_missing_files_say_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        load_dataset("rotated-mnist", data_dir=tmp_path)


def test_cifar10_missing_files_say_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="--download"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_cifar10_via_torchvision_on_tiny_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    # torchvision checks the real files' md5 sums; accept any existing file instead.
    monkeypatch.setattr(cifar, "check_integrity", lambda fpath, md5=None: Path(fpath).is_file())
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        batch = {"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, 2).tolist()}
        batches[name] = batch
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    d = load_dataset("scaled-cifar10", data_dir=tmp_path)
    assert d.x_train.shape == (10, 3, 32, 32) and d.x_test.shape == (2, 3, 32, 32) and d.num_classes == 10
    assert d.y_test.tolist() == batches["test_batch"]["labels"]
    upright = load_dataset("cifar10", data_dir=tmp_path)
    expected = torch.from_numpy(batches["data_batch_1"]["data"]).reshape(2, 3, 32, 32).float() / 255
    assert torch.equal(upright.x_train[:2], expected)
