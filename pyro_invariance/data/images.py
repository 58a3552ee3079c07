"""Image classification datasets and their transformed variants (docs/methods.md §2).

Every dataset is registered in :data:`pyro_invariance.registry.DATASETS` under a name
``<variant>-<base>``, or just ``<base>`` for the untransformed ("regular") variant:

========================  =================================================================
base                      source
========================  =================================================================
``digits``                scikit-learn ``load_digits`` (embedded; 8×8 grey, values 0..16 → /16),
                          fixed stratified split ``train_test_split(test_size=0.25,
                          random_state=0, stratify=y)``: 1347 train / 450 test.
``fashion-mnist``         IDX files (``.gz`` or plain) in ``data_dir``, default
                          ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``).
``mnist``, ``cifar10``    ``torchvision.datasets.MNIST`` / ``CIFAR10`` with ``root=data_dir``
                          (default ``~/.cache/pyro_invariance/torchvision``); nothing is
                          downloaded unless ``download=True``.
========================  =================================================================

=====================  ===========================================================================
variant                each image is warped once by
=====================  ===========================================================================
(none: ``<base>``)     nothing (upright)
``rotated``            θ ~ U[−π, π] (radians)
``partially-rotated``  θ ~ U[−π/2, π/2]
``translated``         tx, ty ~ U[−8/14, 8/14] independently (η = 1 is half the image side,
                       so ±8/14 is ≈ ±7.7 px on 28 px)
``scaled``             isotropic log-scale s ~ U[−ln 2, ln 2] (sx = sy = s)
=====================  ===========================================================================

e.g. ``digits``, ``rotated-digits``, ``partially-rotated-fashion-mnist``, ``translated-mnist``,
``scaled-cifar10``. The 3×3 matrices come from :func:`pyro_invariance.symmetry.affine.lie_exp`
(generators of :func:`~pyro_invariance.symmetry.affine.affine_generators`) and images are warped by
:func:`~pyro_invariance.symmetry.affine.transform_images` (bilinear, zero padding), then clamped to [0, 1].

Seeds: the per-image parameters of the training split are drawn from a ``torch.Generator`` seeded
with :data:`TRAIN_SEED` (1234), those of the test split with :data:`TEST_SEED` (5678), so the two
splits never share transforms. Parameters are drawn for the *whole* split and then the first
``train_size`` / ``test_size`` images are kept, so a subset is exactly a prefix of the full dataset.
The parameters are recorded in ``info["train_params"]`` / ``info["test_params"]`` (shape
``(N, k)``, columns named by ``info["param_names"]``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from pyro_invariance._optional import sklearn_datasets, sklearn_model_selection, torchvision_datasets
from pyro_invariance.data.idx import read_idx
from pyro_invariance.registry import DATASETS
from pyro_invariance.symmetry.affine import (
    GENERATOR_NAMES,
    affine_generators,
    lie_exp,
    sample_epsilon,
    transform_images,
)
from pyro_invariance.validation import check_data_dir, check_subset_size

#: Seed of the per-image transforms of every training split.
TRAIN_SEED = 1234
#: Seed of the per-image transforms of every test split (differs from :data:`TRAIN_SEED`).
TEST_SEED = 5678

DEFAULT_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_TORCHVISION_DIR = Path("~/.cache/pyro_invariance/torchvision")

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
DIGIT_CLASSES = tuple(str(i) for i in range(10))


# --------------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------------


@dataclass(repr=False, eq=False)
class ImageDataset:
    """A train/test pair of labelled images.

    Attributes:
        name: registry name, e.g. ``"rotated-digits"``.
        x_train: ``(N, C, H, W)`` float images (float32 in [0, 1] for the built-in datasets).
        y_train: ``(N,)`` int64 labels in ``[0, num_classes)``.
        x_test: ``(M, C, H, W)``, same ``C, H, W`` as ``x_train``.
        y_test: ``(M,)`` int64 labels.
        num_classes: number of classes.
        info: settings that produced the data (base, variant, source, seeds, sizes, transform
            parameters ``train_params`` / ``test_params`` of shape ``(N, k)``).

    Raises:
        ValueError: on inconsistent shapes, labels out of range or non-finite pixel values.
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prefix = f"dataset {self.name!r}:"
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"{prefix} num_classes must be a positive integer, got {self.num_classes!r}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if not isinstance(x, Tensor) or not isinstance(y, Tensor):
                raise ValueError(f"{prefix} x_{split} and y_{split} must be torch tensors")
            if x.dim() != 4:
                raise ValueError(f"{prefix} x_{split} must have shape (N, C, H, W), got {tuple(x.shape)}")
            if not x.is_floating_point():
                raise ValueError(f"{prefix} x_{split} must be floating point, got {x.dtype}")
            if y.dim() != 1 or y.dtype in (torch.bool,) or y.is_floating_point() or y.is_complex():
                raise ValueError(f"{prefix} y_{split} must be a 1-D integer tensor, got {y.dtype} {tuple(y.shape)}")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"{prefix} x_{split} has {x.shape[0]} images but y_{split} has {y.shape[0]} labels")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"{prefix} y_{split} has labels in [{int(y.min())}, {int(y.max())}], "
                    f"outside [0, {self.num_classes})"
                )
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"{prefix} x_{split} contains NaN or infinite values")
        if self.x_train.shape[0] == 0:
            raise ValueError(f"{prefix} the training split is empty")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(
                f"{prefix} train images {tuple(self.x_train.shape[1:])} and test images "
                f"{tuple(self.x_test.shape[1:])} differ in (C, H, W)"
            )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)

    @property
    def input_dim(self) -> int:
        """``C * H * W``, the length of a flattened image."""
        c, h, w = self.image_shape
        return c * h * w

    def to(self, device: torch.device | str) -> ImageDataset:
        """A copy with the four tensors on ``device`` (``info`` is shared, not copied)."""
        return dataclasses.replace(
            self,
            x_train=self.x_train.to(device),
            y_train=self.y_train.to(device),
            x_test=self.x_test.to(device),
            y_test=self.y_test.to(device),
        )

    def __repr__(self) -> str:
        return (
            f"ImageDataset(name={self.name!r}, train={tuple(self.x_train.shape)}, "
            f"test={tuple(self.x_test.shape)}, num_classes={self.num_classes})"
        )


# --------------------------------------------------------------------------------------------
# Base datasets: each loader returns full splits with raw pixel values and a divisor to [0, 1]
# --------------------------------------------------------------------------------------------


class _Raw(NamedTuple):
    x_train: Tensor  # (N, C, H, W), raw values (uint8 or float)
    y_train: Tensor  # (N,) int64
    x_test: Tensor
    y_test: Tensor
    scale: float  # raw / scale lies in [0, 1]
    classes: tuple[str, ...]
    source: str


def _load_digits(data_dir: Path | None, download: bool) -> _Raw:
    bunch = sklearn_datasets.load_digits()
    x_tr, x_te, y_tr, y_te = sklearn_model_selection.train_test_split(
        bunch.images, bunch.target, test_size=0.25, random_state=0, stratify=bunch.target
    )
    t = torch.from_numpy
    return _Raw(
        t(np.ascontiguousarray(x_tr)).unsqueeze(1),
        t(y_tr).long(),
        t(np.ascontiguousarray(x_te)).unsqueeze(1),
        t(y_te).long(),
        16.0,
        DIGIT_CLASSES,
        "sklearn.datasets.load_digits; train_test_split(test_size=0.25, random_state=0, stratify=y)",
    )


_FASHION_MNIST_STEMS = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def _find_idx_file(directory: Path, stem: str) -> Path:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {str(directory)!r}. Install Debian's package "
        f"(`apt-get install dataset-fashion-mnist`, files land in {DEFAULT_FASHION_MNIST_DIR}) "
        "or pass `--data-dir` (data_dir=...) pointing at a folder with the four IDX files."
    )


def _load_fashion_mnist(data_dir: Path | None, download: bool) -> _Raw:
    directory = Path(data_dir) if data_dir is not None else DEFAULT_FASHION_MNIST_DIR
    paths = {key: _find_idx_file(directory, stem) for key, stem in _FASHION_MNIST_STEMS.items()}
    arrays = {}
    for key, path in paths.items():
        array = read_idx(path)
        want = 3 if key.startswith("x") else 1
        if array.dtype != np.uint8 or array.ndim != want:
            raise ValueError(f"IDX file {str(path)!r}: expected {want}-D uint8 data, got {array.ndim}-D {array.dtype}")
        arrays[key] = torch.from_numpy(array)
    for split in ("train", "test"):
        if arrays[f"x_{split}"].shape[0] != arrays[f"y_{split}"].shape[0]:
            raise ValueError(
                f"Fashion-MNIST {split} files disagree: {arrays[f'x_{split}'].shape[0]} images in "
                f"{str(paths[f'x_{split}'])!r}, {arrays[f'y_{split}'].shape[0]} labels in {str(paths[f'y_{split}'])!r}"
            )
    return _Raw(
        arrays["x_train"].unsqueeze(1),
        arrays["y_train"].long(),
        arrays["x_test"].unsqueeze(1),
        arrays["y_test"].long(),
        255.0,
        FASHION_MNIST_CLASSES,
        f"IDX files in {directory}",
    )


def _load_torchvision(class_name: str, data_dir: Path | None, download: bool) -> tuple[Any, Any, Path]:
    cls = getattr(torchvision_datasets, class_name)
    root = Path(data_dir if data_dir is not None else DEFAULT_TORCHVISION_DIR).expanduser()
    try:
        return cls(str(root), train=True, download=download), cls(str(root), train=False, download=download), root
    except RuntimeError as err:
        if download or "not found" not in str(err):
            raise
        raise FileNotFoundError(
            f"{class_name} files are missing or corrupt under {str(root)!r} (torchvision: {err}). "
            "Pass download=True (CLI: --download) to fetch them, or data_dir=... (CLI: --data-dir) "
            "pointing at a torchvision root that already holds them."
        ) from err


def _load_mnist(data_dir: Path | None, download: bool) -> _Raw:
    train, test, root = _load_torchvision("MNIST", data_dir, download)
    return _Raw(
        train.data.unsqueeze(1),
        train.targets.long(),
        test.data.unsqueeze(1),
        test.targets.long(),
        255.0,
        DIGIT_CLASSES,
        f"torchvision.datasets.MNIST(root={str(root)!r})",
    )


def _load_cifar10(data_dir: Path | None, download: bool) -> _Raw:
    train, test, root = _load_torchvision("CIFAR10", data_dir, download)

    def images(d: Any) -> Tensor:  # (N, H, W, C) uint8 numpy -> (N, C, H, W)
        return torch.from_numpy(np.ascontiguousarray(d.data)).permute(0, 3, 1, 2).contiguous()

    return _Raw(
        images(train),
        torch.as_tensor(train.targets, dtype=torch.int64),
        images(test),
        torch.as_tensor(test.targets, dtype=torch.int64),
        255.0,
        CIFAR10_CLASSES,
        f"torchvision.datasets.CIFAR10(root={str(root)!r})",
    )


#: base name -> (loader, one-line description).
BASES: dict[str, tuple[Callable[[Path | None, bool], _Raw], str]] = {
    "digits": (_load_digits, "scikit-learn digits, 8×8 grey, 10 classes, 1347 train / 450 test"),
    "fashion-mnist": (_load_fashion_mnist, "Fashion-MNIST, 28×28 grey, 10 classes (IDX files)"),
    "mnist": (_load_mnist, "MNIST, 28×28 grey, 10 classes (torchvision)"),
    "cifar10": (_load_cifar10, "CIFAR-10, 32×32 RGB, 10 classes (torchvision)"),
}


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A per-image random affine transform: parameter j ~ U[−eta_j, eta_j] multiplies the sum of
    the generators ``generators[j]`` (names from :data:`pyro_invariance.symmetry.affine.GENERATOR_NAMES`)."""

    name: str
    param_names: tuple[str, ...]
    generators: tuple[tuple[str, ...], ...]
    eta: tuple[float, ...]
    summary: str

    def generator_matrices(self) -> Tensor:
        """``(k, 3, 3)`` float64: one (summed) generator per parameter."""
        basis = affine_generators(dtype=torch.float64)
        return torch.stack([sum(basis[GENERATOR_NAMES.index(g)] for g in group) for group in self.generators])

    def sample_params(self, num: int, seed: int) -> Tensor:
        """``(num, k)`` float64 parameters ε·η with ε ~ U[−1, 1]^k from a generator seeded ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        eps = sample_epsilon(num, len(self.eta), generator=gen, dtype=torch.float64)
        return eps * torch.tensor(self.eta, dtype=torch.float64)

    def matrices(self, params: Tensor) -> Tensor:
        """``(N, 3, 3)`` float64 matrices expm(Σ_j params_j G_j) for ``(N, k)`` parameters."""
        k = len(self.eta)
        return lie_exp(torch.ones(k, dtype=torch.float64), params.to(torch.float64), self.generator_matrices())


REGULAR = "regular"
VARIANTS: dict[str, Variant | None] = {
    REGULAR: None,
    "rotated": Variant("rotated", ("rot",), (("rot",),), (math.pi,), "rotated once by θ ~ U[−π, π]"),
    "partially-rotated": Variant(
        "partially-rotated", ("rot",), (("rot",),), (math.pi / 2,), "rotated once by θ ~ U[−π/2, π/2]"
    ),
    "translated": Variant(
        "translated",
        ("tx", "ty"),
        (("tx",), ("ty",)),
        (8 / 14, 8 / 14),
        "shifted once by tx, ty ~ U[−8/14, 8/14] half-sides",
    ),
    "scaled": Variant(
        "scaled", ("log_scale",), (("sx", "sy"),), (math.log(2.0),), "scaled once by e^s, s ~ U[−ln 2, ln 2]"
    ),
}


def warp_images(images: Tensor, matrices: Tensor, chunk: int = 4096) -> Tensor:
    """Warp ``(N, C, H, W)`` float images by ``(N, 3, 3)`` matrices in chunks; clamp to [0, 1]."""
    out = torch.empty_like(images)
    for start in range(0, images.shape[0], chunk):
        stop = start + chunk
        out[start:stop] = transform_images(images[start:stop], matrices[start:stop])
    return out.clamp_(0.0, 1.0)


# --------------------------------------------------------------------------------------------
# Building and registering
# --------------------------------------------------------------------------------------------


def dataset_name(base: str, variant: str = REGULAR) -> str:
    """Registry name of ``variant`` of ``base``: ``base`` or ``f"{variant}-{base}"``."""
    return base if variant == REGULAR else f"{variant}-{base}"


def _resolve_dir(data_dir: str | os.PathLike[str] | None, root: str | os.PathLike[str] | None) -> Path | None:
    check_data_dir(data_dir)
    check_data_dir(root, "root")
    if data_dir is not None and root is not None and Path(data_dir) != Path(root):
        raise ValueError(f"data_dir={str(data_dir)!r} and root={str(root)!r} disagree; pass one of them")
    chosen = data_dir if data_dir is not None else root
    return Path(chosen).expanduser() if chosen is not None else None


def build_dataset(
    base: str,
    variant: str = REGULAR,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    train_size: int | None = None,
    test_size: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> ImageDataset:
    """Load ``base``, keep the first ``train_size`` / ``test_size`` examples, apply ``variant``.

    ``root`` is an alias of ``data_dir`` (torchvision's name). Returns images ``(N, C, H, W)``
    float32 in [0, 1] and int64 labels; see the module docstring for seeds and variants.
    """
    if base not in BASES:
        raise ValueError(f"unknown base dataset {base!r}; known: {', '.join(BASES)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    for what, size in (("train_size", train_size), ("test_size", test_size)):
        check_subset_size(what, size, sys.maxsize)  # bad sizes fail before any file is read
    loader, _ = BASES[base]
    raw = loader(_resolve_dir(data_dir, root), download)
    n_avail, m_avail = raw.x_train.shape[0], raw.x_test.shape[0]
    n = check_subset_size("train_size", train_size, n_avail)
    m = check_subset_size("test_size", test_size, m_avail)
    x_train = raw.x_train[:n].to(torch.float32) / raw.scale
    x_test = raw.x_test[:m].to(torch.float32) / raw.scale
    info: dict[str, Any] = {
        "base": base,
        "variant": variant,
        "source": raw.source,
        "classes": raw.classes,
        "train_size": n,
        "test_size": m,
        "available_train": n_avail,
        "available_test": m_avail,
    }
    spec = VARIANTS[variant]
    if spec is not None:
        # Draw parameters for the whole split, then keep the prefix: subsets are prefixes.
        train_params = spec.sample_params(n_avail, TRAIN_SEED)[:n]
        test_params = spec.sample_params(m_avail, TEST_SEED)[:m]
        x_train = warp_images(x_train, spec.matrices(train_params))
        x_test = warp_images(x_test, spec.matrices(test_params))
        info.update(
            transform=spec.summary,
            param_names=spec.param_names,
            eta=spec.eta,
            train_seed=TRAIN_SEED,
            test_seed=TEST_SEED,
            train_params=train_params,
            test_params=test_params,
            interpolation="bilinear, zero padding, clamped to [0, 1]",
        )
    return ImageDataset(
        dataset_name(base, variant),
        x_train,
        raw.y_train[:n].clone(),
        x_test,
        raw.y_test[:m].clone(),
        len(raw.classes),
        info,
    )


def _make_factory(base: str, variant: str) -> Callable[..., ImageDataset]:
    def factory(
        *,
        data_dir: str | os.PathLike[str] | None = None,
        download: bool = False,
        train_size: int | None = None,
        test_size: int | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> ImageDataset:
        return build_dataset(
            base, variant, data_dir=data_dir, download=download, train_size=train_size, test_size=test_size, root=root
        )

    name = dataset_name(base, variant)
    factory.__name__ = factory.__qualname__ = "load_" + name.replace("-", "_")
    factory.__doc__ = f"{name}: {BASES[base][1]}" + (f"; {VARIANTS[variant].summary}." if variant != REGULAR else ".")
    return factory


for _base in BASES:
    for _variant in VARIANTS:
        _factory = _make_factory(_base, _variant)
        DATASETS.register(
            dataset_name(_base, _variant),
            summary=_factory.__doc__.splitlines()[0],
            kind=("classification", "images"),
        )(_factory)
del _base, _variant, _factory


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    train_size: int | None = None,
    test_size: int | None = None,
    root: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> Any:
    """Load the registered dataset ``name`` (see :func:`list_datasets`).

    Only the arguments given (not ``None``; ``download`` only when true) reach the dataset's
    factory, so every registered name loads with the defaults: image datasets, the quadrant task,
    ``rotation-toy-2d`` and the physics datasets (``sho``, ``oscillators-3``, ...).

    Args:
        name: e.g. ``"digits"``, ``"rotated-fashion-mnist"``, ``"scaled-cifar10"``, ``"sho"``.
        data_dir: folder with the files (Fashion-MNIST IDX folder, or torchvision root); ``root``
            is an alias. A path to an existing *file* is refused (``ValueError``) for every image
            dataset, ``digits`` included, although ``digits`` reads no folder (it is embedded in
            scikit-learn): a file is never a data folder, so it is a mistake worth reporting.
            Datasets that are generated (physics, ``rotation-toy-2d``) refuse any ``data_dir``.
        download: let torchvision download MNIST / CIFAR-10 when missing (never implicit).
        train_size, test_size: keep the first n examples of each split (default: all); must be a
            positive integer (0 is refused).
        **kwargs: further arguments of the dataset's factory (e.g. ``size`` for the quadrant task,
            ``cache_dir`` or ``train_trajectories`` for physics data).

    Returns:
        the dataset: :class:`ImageDataset` with ``(N, C, H, W)`` float32 images in [0, 1] for image
        names; :class:`~pyro_invariance.data.physics.PhysicsDataset` /
        :class:`~pyro_invariance.data.toy2d.Toy2DDataset` for the others.

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the known names).
        FileNotFoundError: the data files are missing (the message says how to get them).
        ValueError: bad sizes, a ``data_dir`` that is a file, or corrupt files.
    """
    given = {"data_dir": data_dir, "train_size": train_size, "test_size": test_size, "root": root}
    kwargs.update({k: v for k, v in given.items() if v is not None})
    if download:
        kwargs["download"] = download
    return DATASETS.get(name, **kwargs)


def list_datasets() -> list[str]:
    """All registered dataset names, sorted."""
    return DATASETS.names()
