"""Datasets for layer-wise equivariance (paper 004, ELLA): the quadrant task and resized images.

**Quadrant task** (paper 004 Section 5.1, Table 1; docs/methods.md §2). Every ``h×w`` image of a base
dataset is pasted into one of the four quadrants of a ``2h×2w`` zero canvas (quadrant drawn
uniformly per image, seeded), then the canvas is resized to ``size×size`` (bilinear, antialiased).
Quadrants are numbered 0 = upper left, 1 = upper right, 2 = lower left, 3 = lower right.

* ``quadrant-<base>``: label = class (10 classes) -- a translation-invariant task;
* ``quadrant-<base>-40``: label = class + 10·quadrant (40 classes) -- position matters, so a
  strictly translation-invariant network (the paper's CONV model) cannot solve it.

Both names draw the *same* images and quadrants (the 40-class labels refine the 10-class ones).
Default sizes: 28×28 bases → 56×56 canvas → 32×32 (the paper's recipe); 8×8 digits → 16×16
canvas, kept at 16×16 (``size`` overrides). Quadrants are drawn with :data:`~pyro_invariance.data.images.TRAIN_SEED`
for the training split and :data:`~pyro_invariance.data.images.TEST_SEED` for the test split, for the
whole split, so subsets are prefixes.

**Resized datasets** for the group-selection experiment (paper 004 Table 3: MNIST, translated and
rotated MNIST, CIFAR-10 at 32×32): ``<variant>-<base>-<size>px`` is the registered
``<variant>-<base>`` (transform applied at the original size) resized to ``size×size``, e.g.
``rotated-fashion-mnist-32px``, ``rotated-digits-16px``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pyro_invariance.data.images import (
    REGULAR,
    TEST_SEED,
    TRAIN_SEED,
    VARIANTS,
    ImageDataset,
    build_dataset,
    dataset_name,
)
from pyro_invariance.registry import DATASETS

QUADRANT_BASES = ("digits", "fashion-mnist", "mnist")
#: Output side length per base (the paper's 32 for 28×28 images; 16 for 8×8 digits).
DEFAULT_SIZE = {"digits": 16, "fashion-mnist": 32, "mnist": 32, "cifar10": 32}
QUADRANT_NAMES = ("upper left", "upper right", "lower left", "lower right")

__all__ = [
    "QUADRANT_BASES",
    "build_quadrant_dataset",
    "build_resized_dataset",
    "paste_in_quadrants",
    "resize_images",
]


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    return size


def resize_images(images: Tensor, size: int) -> Tensor:
    """``(N, C, H, W)`` → ``(N, C, size, size)``: bilinear with antialiasing when shrinking; identity
    when the size already matches. Values are clamped to [0, 1]."""
    size = _check_size(size)
    if images.shape[-2:] == (size, size):
        return images.clone()
    out = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return out.clamp_(0.0, 1.0)


def paste_in_quadrants(images: Tensor, quadrants: Tensor) -> Tensor:
    """Paste each ``(C, h, w)`` image into quadrant ``quadrants[n]`` ∈ {0, 1, 2, 3} of a zero
    ``(C, 2h, 2w)`` canvas. Returns ``(N, C, 2h, 2w)``."""
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    if quadrants.shape != images.shape[:1]:
        raise ValueError(f"quadrants must have shape ({images.shape[0]},), got {tuple(quadrants.shape)}")
    if quadrants.numel() and (int(quadrants.min()) < 0 or int(quadrants.max()) > 3):
        raise ValueError("quadrants must lie in {0, 1, 2, 3}")
    n, c, h, w = images.shape
    canvas = images.new_zeros(n, c, 2 * h, 2 * w)
    for q in range(4):
        idx = (quadrants == q).nonzero(as_tuple=True)[0]
        r0, c0 = (q // 2) * h, (q % 2) * w
        canvas[idx, :, r0 : r0 + h, c0 : c0 + w] = images[idx]
    return canvas


def _quadrants(num: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (num,), generator=gen)


def build_quadrant_dataset(
    base: str,
    num_classes: int = 10,
    *,
    size: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    train_size: int | None = None,
    test_size: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> ImageDataset:
    """The quadrant task on ``base`` (see module docstring).

    Args:
        base: ``"digits"``, ``"fashion-mnist"`` or ``"mnist"``.
        num_classes: 10 (label = class) or 40 (label = class + 10·quadrant).
        size: output side length (default :data:`DEFAULT_SIZE` of the base).
        data_dir, download, train_size, test_size, root: as :func:`~pyro_invariance.data.images.build_dataset`.

    Returns:
        :class:`~pyro_invariance.data.images.ImageDataset` with images ``(N, 1, size, size)``;
        ``info["train_quadrants"]`` / ``info["test_quadrants"]`` hold the quadrants.
    """
    if base not in QUADRANT_BASES:
        raise ValueError(f"unknown quadrant base {base!r}; known: {', '.join(QUADRANT_BASES)}")
    if num_classes not in (10, 40):
        raise ValueError(f"num_classes must be 10 (digit) or 40 (digit + quadrant), got {num_classes!r}")
    size = _check_size(DEFAULT_SIZE[base] if size is None else size)
    src = build_dataset(
        base, REGULAR, data_dir=data_dir, download=download, train_size=train_size, test_size=test_size, root=root
    )
    n_avail, m_avail = src.info["available_train"], src.info["available_test"]
    q_train = _quadrants(n_avail, TRAIN_SEED)[: src.x_train.shape[0]]
    q_test = _quadrants(m_avail, TEST_SEED)[: src.x_test.shape[0]]
    x_train = resize_images(paste_in_quadrants(src.x_train, q_train), size)
    x_test = resize_images(paste_in_quadrants(src.x_test, q_test), size)
    y_train, y_test = src.y_train.clone(), src.y_test.clone()
    if num_classes == 40:
        y_train = y_train + 10 * q_train
        y_test = y_test + 10 * q_test
        classes = tuple(f"{c} ({q})" for q in QUADRANT_NAMES for c in src.info["classes"])
    else:
        classes = src.info["classes"]
    info = dict(src.info)
    info.update(
        task="digit + quadrant" if num_classes == 40 else "digit",
        classes=classes,
        size=size,
        canvas=(2 * src.x_train.shape[-2], 2 * src.x_train.shape[-1]),
        train_quadrants=q_train,
        test_quadrants=q_test,
        train_seed=TRAIN_SEED,
        test_seed=TEST_SEED,
        interpolation="pasted in a zero canvas of twice the side, resized bilinear (antialiased)",
    )
    name = f"quadrant-{base}" + ("-40" if num_classes == 40 else "")
    return ImageDataset(name, x_train, y_train, x_test, y_test, num_classes, info)


def build_resized_dataset(base: str, variant: str = REGULAR, *, size: int | None = None, **kwargs: Any) -> ImageDataset:
    """``<variant>-<base>`` (transformed at its own size) resized to ``size×size`` (see module docstring)."""
    size = _check_size(DEFAULT_SIZE.get(base, 32) if size is None else size)
    src = build_dataset(base, variant, **kwargs)
    info = dict(src.info, size=size, resized="bilinear (antialiased when shrinking)")
    name = f"{dataset_name(base, variant)}-{size}px"
    return ImageDataset(
        name,
        resize_images(src.x_train, size),
        src.y_train.clone(),
        resize_images(src.x_test, size),
        src.y_test.clone(),
        src.num_classes,
        info,
    )


def _quadrant_factory(base: str, num_classes: int) -> Callable[..., ImageDataset]:
    def factory(
        *,
        size: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        download: bool = False,
        train_size: int | None = None,
        test_size: int | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> ImageDataset:
        return build_quadrant_dataset(
            base,
            num_classes,
            size=size,
            data_dir=data_dir,
            download=download,
            train_size=train_size,
            test_size=test_size,
            root=root,
        )

    task = "digit + quadrant, 40 classes" if num_classes == 40 else "digit, 10 classes"
    factory.__doc__ = f"quadrant task on {base}: image in a random quadrant of a 2× canvas ({task})"
    return factory


def _resized_factory(base: str, variant: str, size: int) -> Callable[..., ImageDataset]:
    def factory(
        *,
        data_dir: str | os.PathLike[str] | None = None,
        download: bool = False,
        train_size: int | None = None,
        test_size: int | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> ImageDataset:
        return build_resized_dataset(
            base,
            variant,
            size=size,
            data_dir=data_dir,
            download=download,
            train_size=train_size,
            test_size=test_size,
            root=root,
        )

    what = "upright" if variant == REGULAR else VARIANTS[variant].summary
    factory.__doc__ = f"{dataset_name(base, variant)} ({what}) resized to {size}×{size}"
    return factory


for _base in QUADRANT_BASES:
    for _classes in (10, 40):
        _f = _quadrant_factory(_base, _classes)
        _name = f"quadrant-{_base}" + ("-40" if _classes == 40 else "")
        DATASETS.register(_name, summary=_f.__doc__, kind=("classification", "images"))(_f)
    for _variant in (REGULAR, "rotated", "translated"):
        _size = DEFAULT_SIZE[_base]
        _f = _resized_factory(_base, _variant, _size)
        _name = f"{dataset_name(_base, _variant)}-{_size}px"
        DATASETS.register(_name, summary=_f.__doc__, kind=("classification", "images"))(_f)
del _base, _classes, _variant, _size, _f, _name
