"""The 2-D rotation toy of paper 003, Figure 1: data, its registry entry and the extrapolation plot.

Figure 1 of paper 003 ("Learning Invariant Weights in Neural Networks") shows one small data set in
the plane and the predictions of models with no, some and full rotational invariance: away from the
data only the invariant models carry the fitted pattern around the circle. This module provides

* :func:`make_rotation_toy` — the data, registered as ``"rotation-toy-2d"`` in
  :data:`pyro_invariance.registry.DATASETS`. The label depends on the radius only (class 0, "○",
  on an inner ring of radius ``radii[0]``; class 1, "×", on an outer ring of radius ``radii[1]``),
  so the task is rotation invariant, but the training points cover only an angular *sector* of
  width ``sector`` around ``center``. The test split covers the whole circle, so test accuracy
  outside the sector measures extrapolation (:func:`in_sector` tells the two parts apart).
* :func:`plot_extrapolation` — predictive-probability contours over the plane, one panel per model
  (e.g. η = 0, π/2, π), with the training points drawn as ○ and ×. The figure itself is made by
  ``benchmarks/toy2d_figure.py``.

Seeds: the training split is drawn from :data:`pyro_invariance.data.images.TRAIN_SEED` + ``seed``, the
test split from :data:`~pyro_invariance.data.images.TEST_SEED` + ``seed``; the two never coincide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from pyro_invariance._optional import pyplot as plt
from pyro_invariance.data.images import TEST_SEED, TRAIN_SEED
from pyro_invariance.registry import DATASETS
from pyro_invariance.tasks import posterior_predictive
from pyro_invariance.validation import check_positive_float, check_positive_int, refuse_data_dir

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "Toy2DDataset",
    "make_rotation_toy",
    "in_sector",
    "plane_grid",
    "predictive_probabilities",
    "plot_extrapolation",
]

#: Markers of the two classes in plots (paper 003, Fig. 1: ○ and ×).
CLASS_MARKERS = ("o", "x")


@dataclass(repr=False, eq=False)
class Toy2DDataset:
    """Labelled points in the plane, train/test split (same attribute names as the image datasets).

    Attributes:
        name: registry name (``"rotation-toy-2d"``).
        x_train: ``(N, 2)`` float32 points.
        y_train: ``(N,)`` int64 labels in ``{0, 1}``.
        x_test: ``(M, 2)`` float32 points (the whole circle).
        y_test: ``(M,)`` int64 labels.
        num_classes: 2.
        info: the settings that produced the data (sizes, seeds, radii, sector, centre).
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int = 2
    info: dict[str, Any] = field(default_factory=dict)

    #: input dimension (for :func:`pyro_invariance.catalogue.model_kwargs_for`)
    input_dim: int = 2

    def __repr__(self) -> str:
        return (
            f"Toy2DDataset({self.name!r}, train={tuple(self.x_train.shape)}, test={tuple(self.x_test.shape)}, "
            f"sector={self.info.get('sector'):.3f} rad)"
        )


def _rings(n: int, angle_lo: float, angle_hi: float, radii: Sequence[float], noise: float, gen: torch.Generator):
    """``n`` points, classes balanced (first ⌈n/2⌉ class 0) and then shuffled; float64."""
    labels = torch.cat([torch.zeros((n + 1) // 2, dtype=torch.int64), torch.ones(n // 2, dtype=torch.int64)])
    labels = labels[torch.randperm(n, generator=gen)]
    angle = angle_lo + (angle_hi - angle_lo) * torch.rand(n, generator=gen, dtype=torch.float64)
    radius = torch.tensor([float(r) for r in radii], dtype=torch.float64)[labels]
    radius = radius + noise * torch.randn(n, generator=gen, dtype=torch.float64)
    x = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)
    return x, labels


def make_rotation_toy(
    train_size: int = 40,
    test_size: int = 400,
    sector: float = math.pi / 2,
    center: float = 0.0,
    radii: Sequence[float] = (1.0, 2.0),
    radial_noise: float = 0.15,
    seed: int = 0,
) -> Toy2DDataset:
    """Two concentric rings (label = ring), training points on a sector, test points all around.

    Training angles are ``U[center − sector/2, center + sector/2]``, test angles ``U[−π, π]``; the
    radius of a class-``k`` point is ``radii[k] + radial_noise·N(0, 1)``. Classes are balanced in
    each split. Deterministic in ``seed``; the test split uses a different seed from the training
    split.

    Args:
        train_size, test_size: number of points per split (≥ 2).
        sector: angular width of the training region in radians, in ``(0, 2π]``.
        center: angle of the middle of the training sector (radians).
        radii: ring radii of class 0 and class 1 (positive, distinct).
        radial_noise: standard deviation of the radius around its ring (≥ 0).
        seed: added to the fixed train/test seeds.
    """
    check_positive_int("train_size", train_size, minimum=2)
    check_positive_int("test_size", test_size, minimum=2)
    sector = check_positive_float("sector", sector)
    if sector > 2 * math.pi + 1e-12:
        raise ValueError(f"sector must lie in (0, 2π], got {sector}")
    center = float(center)
    if not math.isfinite(center):
        raise ValueError(f"center must be finite, got {center}")
    radii = tuple(float(r) for r in radii)
    if len(radii) != 2 or min(radii) <= 0 or not all(map(math.isfinite, radii)) or radii[0] == radii[1]:
        raise ValueError(f"radii must be two distinct positive numbers, got {radii}")
    radial_noise = float(radial_noise)
    if not (math.isfinite(radial_noise) and radial_noise >= 0):
        raise ValueError(f"radial_noise must be a finite number >= 0, got {radial_noise!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")

    gen_train = torch.Generator().manual_seed(TRAIN_SEED + seed)
    gen_test = torch.Generator().manual_seed(TEST_SEED + seed)
    x_train, y_train = _rings(train_size, center - sector / 2, center + sector / 2, radii, radial_noise, gen_train)
    x_test, y_test = _rings(test_size, -math.pi, math.pi, radii, radial_noise, gen_test)
    info = {
        "train_size": train_size,
        "test_size": test_size,
        "sector": sector,
        "center": center,
        "radii": list(radii),
        "radial_noise": radial_noise,
        "seed": seed,
        "train_seed": TRAIN_SEED + seed,
        "test_seed": TEST_SEED + seed,
        "task": "label = ring (rotation invariant); training points on a sector, test points on the whole circle",
    }
    return Toy2DDataset("rotation-toy-2d", x_train.float(), y_train, x_test.float(), y_test, num_classes=2, info=info)


def rotation_toy_2d(*, data_dir: Any = None, root: Any = None, download: bool = False, **kwargs: Any) -> Toy2DDataset:
    """2-D rotation toy (see :func:`make_rotation_toy` for the keyword arguments).

    Takes the keywords of every registered dataset: ``data_dir`` / ``root`` are refused unless
    ``None`` (the points are generated), ``download`` is ignored, ``train_size`` / ``test_size``
    of ``None`` mean the defaults.
    """
    refuse_data_dir("rotation-toy-2d", data_dir=data_dir, root=root)
    defaults = ("train_size", "test_size")
    return make_rotation_toy(**{k: v for k, v in kwargs.items() if not (k in defaults and v is None)})


DATASETS.register(
    "rotation-toy-2d",
    summary="2-D toy (paper 003 Fig. 1): two rings, training points on a 90° sector, test on the whole circle",
    kind=("classification", "vectors"),
)(rotation_toy_2d)


def in_sector(x: Tensor, sector: float, center: float = 0.0) -> Tensor:
    """Boolean mask of the points of ``x`` (``(N, 2)``) whose angle lies in the training sector."""
    angle = torch.atan2(x[:, 1], x[:, 0]).to(torch.float64)
    offset = torch.remainder(angle - center + math.pi, 2 * math.pi) - math.pi  # in [−π, π)
    return offset.abs() <= sector / 2


def plane_grid(extent: float = 3.0, size: int = 81) -> tuple[np.ndarray, np.ndarray, Tensor]:
    """A square grid over ``[−extent, extent]²``: ``(xx, yy)`` for contour plots and the points ``(size², 2)``."""
    check_positive_float("extent", extent)
    check_positive_int("size", size, minimum=2)
    axis = np.linspace(-extent, extent, size)
    xx, yy = np.meshgrid(axis, axis)
    points = torch.as_tensor(np.stack([xx.ravel(), yy.ravel()], axis=-1), dtype=torch.float32)
    return xx, yy, points


@torch.no_grad()
def predictive_probabilities(model: Any, guide: Any, x: Tensor, num_samples: int = 32, seed: int = 0) -> Tensor:
    """Posterior predictive class probabilities ``(1/K) Σ_k softmax(logits(x; θ_k))``, ``θ_k ~ guide``.

    Returns ``(N, C)``. The global RNG state is restored afterwards.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        logits = posterior_predictive(model, guide, x, num_samples=num_samples)
    return logits.softmax(-1).mean(0)


def _panel_probabilities(value: Any, points: Tensor, num_samples: int) -> np.ndarray:
    """Class-1 probability on the grid points from one panel's value."""
    if hasattr(value, "model") and hasattr(value, "guide"):  # FitResult
        value = (value.model, value.guide)
    if isinstance(value, tuple) and len(value) == 2:
        probs = predictive_probabilities(value[0], value[1], points, num_samples=num_samples)
        return probs[:, 1].cpu().numpy()
    if callable(value):
        out = value(points)
    else:
        out = value
    out = np.asarray(out.detach().cpu() if isinstance(out, Tensor) else out, dtype=np.float64)
    if out.ndim == 2 and out.shape == (points.shape[0], 2):
        out = out[:, 1]
    if out.size != points.shape[0]:
        raise ValueError(
            f"a panel's probabilities must have one value per grid point ({points.shape[0]}) or shape "
            f"({points.shape[0]}, 2); got shape {out.shape}"
        )
    return out.reshape(-1)


def plot_extrapolation(
    panels: Mapping[str, Any],
    *,
    data: Toy2DDataset | None = None,
    extent: float = 3.0,
    grid_size: int = 81,
    num_samples: int = 32,
    title: str = "",
    fig: Figure | None = None,
) -> Figure:
    """Predictive contours of p(class 1 | x) over the plane, one panel per model (paper 003, Fig. 1).

    Args:
        panels: label → one of: a :class:`~pyro_invariance.infer.training.FitResult` or a pair
            ``(model, guide)`` (posterior predictive from ``num_samples`` guide draws); a callable
            ``points (G, 2) -> probabilities`` (``(G,)`` for class 1 or ``(G, 2)``); or an array of
            ``G = grid_size²`` class-1 probabilities on :func:`plane_grid`'s points.
            E.g. ``{"no invariance (η = 0)": r0, "some (η = π/2)": r1, "full (η = π)": r2}``.
        data: the dataset whose training points (○ class 0, × class 1) and sector are drawn.
        extent, grid_size: the grid ``[−extent, extent]²`` with ``grid_size`` points per axis.
        num_samples: guide draws per model panel.
        title: figure title.
        fig: an empty figure to draw into (default: a new one).

    Returns:
        The figure: one square panel per entry of ``panels`` and a shared colour bar. Save it with
        ``fig.savefig(path, bbox_inches="tight")`` (the colour bar sits outside the panels).
    """
    if not panels:
        raise ValueError("panels is empty: give at least one label -> model/guide, callable or array")
    xx, yy, points = plane_grid(extent, grid_size)
    fig = fig if fig is not None else plt.figure(figsize=(3.6 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    levels = np.linspace(0.0, 1.0, 11)
    contour = None
    for ax, (label, value) in zip(axes[0], panels.items()):
        prob = _panel_probabilities(value, points, num_samples).reshape(xx.shape)
        contour = ax.contourf(xx, yy, prob, levels=levels, cmap="RdBu_r", vmin=0.0, vmax=1.0)
        ax.contour(xx, yy, prob, levels=[0.5], colors="k", linewidths=1.0)
        if data is not None:
            x, y = data.x_train.cpu().numpy(), data.y_train.cpu().numpy()
            for k, marker in enumerate(CLASS_MARKERS):
                sel = y == k
                style = {"facecolors": "none", "edgecolors": "k"} if marker == "o" else {"c": "k"}
                ax.scatter(x[sel, 0], x[sel, 1], marker=marker, s=22, linewidths=1.0, **style)
            sector, center = data.info.get("sector"), data.info.get("center", 0.0)
            if sector is not None and sector < 2 * math.pi:
                for a in (center - sector / 2, center + sector / 2):
                    ax.plot([0, 1.5 * extent * math.cos(a)], [0, 1.5 * extent * math.sin(a)], "k:", lw=0.8)
        ax.set(xlim=(-extent, extent), ylim=(-extent, extent), aspect="equal", title=str(label))
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(contour, ax=list(axes[0]), shrink=0.8, label="p(× | x)")
    if title:
        fig.suptitle(title)
    return fig
