"""Tests of the quadrant task and resized datasets (pyro_invariance.data.quadrant; paper 004 Table 1/3)."""

from __future__ import annotations

import pytest
import torch
from test_datasets import write_mnist_like

from pyro_invariance.data.images import load_dataset
from pyro_invariance.data.quadrant import build_quadrant_dataset, paste_in_quadrants, resize_images
from pyro_invariance.registry import DATASETS, UnknownNameError

torch.set_num_threads(1)


def _mass_by_quadrant(x: torch.Tensor) -> torch.Tensor:
    """``(N, 4)`` pixel mass in each quadrant of ``(N, C, S, S)`` images."""
    s = x.shape[-1] // 2
    parts = [x[..., :s, :s], x[..., :s, s:], x[..., s:, :s], x[..., s:, s:]]
    return torch.stack([p.sum(dim=(1, 2, 3)) for p in parts], dim=1)


def test_paste_puts_each_image_in_its_quadrant():
    images = torch.rand(8, 1, 3, 3) + 0.1
    quadrants = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    canvas = paste_in_quadrants(images, quadrants)
    assert canvas.shape == (8, 1, 6, 6)
    mass = _mass_by_quadrant(canvas)
    assert torch.equal(mass.argmax(dim=1), quadrants)
    assert torch.allclose(mass.sum(dim=1), images.sum(dim=(1, 2, 3)))
    assert torch.equal(canvas[1, :, 0:3, 3:6], images[1])  # quadrant 1 = upper right
    assert torch.equal(canvas[2, :, 3:6, 0:3], images[2])  # quadrant 2 = lower left


def test_quadrant_digits_labels_quadrants_and_sizes():
    d10 = load_dataset("quadrant-digits", train_size=200, test_size=100)
    d40 = DATASETS.get("quadrant-digits-40", train_size=200, test_size=100)
    assert d10.x_train.shape == (200, 1, 16, 16) and d10.num_classes == 10 and d40.num_classes == 40
    assert torch.equal(d10.x_train, d40.x_train) and torch.equal(d10.x_test, d40.x_test)
    q = d40.info["train_quadrants"]
    assert torch.equal(d40.y_train, d10.y_train + 10 * q)
    assert torch.equal(d40.y_train % 10, d10.y_train) and torch.equal(d40.y_train // 10, q)
    # the image mass sits in the recorded quadrant
    assert torch.equal(_mass_by_quadrant(d10.x_train).argmax(dim=1), q)
    assert set(q.tolist()) == {0, 1, 2, 3}
    assert len(d40.info["classes"]) == 40
    # different seeds for train and test quadrants, prefixes stay prefixes
    full = load_dataset("quadrant-digits")
    assert torch.equal(full.x_train[:200], d10.x_train)
    assert not torch.equal(full.info["train_quadrants"][:450], full.info["test_quadrants"])


def test_quadrant_of_28px_images_is_resized_to_32(tmp_path):
    write_mnist_like(tmp_path, n_train=12, n_test=6)
    d = load_dataset("quadrant-fashion-mnist-40", data_dir=tmp_path)
    assert d.x_train.shape == (12, 1, 32, 32) and d.x_test.shape == (6, 1, 32, 32)
    assert float(d.x_train.min()) >= 0.0 and float(d.x_train.max()) <= 1.0
    assert d.info["canvas"] == (56, 56) and d.info["size"] == 32
    big = build_quadrant_dataset("fashion-mnist", 40, size=56, data_dir=tmp_path)
    assert torch.equal(_mass_by_quadrant(big.x_train).argmax(dim=1), big.info["train_quadrants"])


def test_resized_datasets():
    d = load_dataset("rotated-digits-16px", train_size=30, test_size=10)
    src = load_dataset("rotated-digits", train_size=30, test_size=10)
    assert d.x_train.shape == (30, 1, 16, 16) and torch.equal(d.y_train, src.y_train)
    assert torch.allclose(d.x_train.sum(dim=(1, 2, 3)) / 4, src.x_train.sum(dim=(1, 2, 3)), rtol=0.05, atol=0.05)
    assert torch.equal(resize_images(src.x_train, 8), src.x_train)


def test_bad_input():
    with pytest.raises(ValueError, match="num_classes"):
        build_quadrant_dataset("digits", 20)
    with pytest.raises(ValueError, match="unknown quadrant base"):
        build_quadrant_dataset("cifar10")
    with pytest.raises(ValueError, match="size"):
        build_quadrant_dataset("digits", size=0)
    with pytest.raises(UnknownNameError):
        load_dataset("quadrant-digit")
    with pytest.raises(ValueError, match="quadrants"):
        paste_in_quadrants(torch.rand(2, 1, 3, 3), torch.tensor([0, 4]))
