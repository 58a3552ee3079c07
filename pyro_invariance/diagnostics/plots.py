"""Plots users expect from a symmetry-learning run (matplotlib figures).

=================================  ==============================================================
function                           what
=================================  ==============================================================
:func:`plot_eta_history`           η per generator over training, in human units (degrees,
                                   pixels, scale factors), beside the data's true range; ELBO/N
:func:`plot_filter_bank`           InvariantMLP: first-layer rows warped over ε ∈ [−1, 1]
:func:`plot_orbits`                InvariantMLP: what the learned η does -- a few first-layer filters
                                   (ReLU) or input images (RFF) transformed over ε ∈ [−1, 1]
:func:`plot_filter_banks`          layer-wise models: the conv filters (and FC receptive fields)
                                   of one block, from site values (e.g. a guide's ``median()``)
:func:`plot_generators`            the learned affine generator Σ ηᵢGᵢ as a vector field on the
                                   image plane, and an example image transformed along it
:func:`plot_conserved_quantities`  Noether's razor: level sets of the learned conserved quantities
                                   C(x) = xᵀAx/2 + bᵀx and their flows on a phase-space plane
:func:`model_figures`              a fitted model's own figures, by name (what the CLI saves
                                   beside a run): an InvariantMLP's filter bank and orbits
=================================  ==============================================================

Every function follows the matplotlib convention: it draws into ``fig=`` (an empty
:class:`~matplotlib.figure.Figure`, e.g. ``plt.figure()``) or a new pyplot figure, and returns the
figure; saving is the caller's (``fig.savefig(path)``, or :func:`save_figure`, which also closes it).
No function selects a backend: scripts without a display set ``MPLBACKEND=Agg`` (matplotlib falls
back to Agg by itself where no display is found). For the Hamiltonian generators as heat maps and
their SVD, see :func:`pyro_invariance.diagnostics.hnn_metrics.plot_generators` and
:func:`~pyro_invariance.diagnostics.hnn_metrics.plot_symmetry_analysis`; for ArviZ's own plots on posterior
draws, :func:`pyro_invariance.diagnostics.inference_data.plot_posterior` / ``plot_forest``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pyro_invariance._optional import pyplot as plt
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.data.images import VARIANTS
from pyro_invariance.models.invariant_mlp import InvariantMLP
from pyro_invariance.symmetry.affine import (
    GENERATOR_NAMES,
    affine_generators,
    eta_to_human,
    lie_exp,
    transform_images,
    transform_weight_rows,
)
from pyro_invariance.symmetry.conserved import quadratic_from_generator

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "data_eta_range",
    "model_figures",
    "plot_conserved_quantities",
    "plot_eta_history",
    "plot_filter_bank",
    "plot_filter_banks",
    "plot_generators",
    "plot_orbits",
    "save_figure",
]

# Panels of plot_eta_history: generator names -> (panel title, y label, η -> display value).
_UNITS: dict[str, tuple[str, str]] = {
    "rot": ("rotation", "η_rot (degrees)"),
    "tx": ("translation", "η (half image sides)"),
    "ty": ("translation", "η (half image sides)"),
    "sx": ("scale", "max. scale factor e^η"),
    "sy": ("scale", "max. scale factor e^η"),
    "shear": ("shear", "η_shear"),
}


def _human(name: str, values: np.ndarray, image_size: int | None) -> np.ndarray:
    """η in display units: degrees for rotation, pixels for translation (with ``image_size``),
    the largest scale factor e^η for scale, η otherwise (see :func:`symmetry.eta_to_human`)."""
    if name == "rot":
        return np.degrees(values)
    if name in ("tx", "ty") and image_size:
        return values * (image_size - 1) / 2
    if name in ("sx", "sy"):
        return np.exp(values)
    return values


def data_eta_range(data: Any) -> dict[str, float]:
    """The true η per generator of a transformed dataset (``rotated-*``: rot = π; ``scaled-*``:
    sx = sy = ln 2, ...), from ``data.info``; ``{}`` for an untransformed dataset."""
    info = getattr(data, "info", None)
    if not isinstance(info, dict) or "eta" not in info:
        return {}
    variant = VARIANTS.get(info.get("variant"))
    groups = variant.generators if variant is not None else tuple((n,) for n in info.get("param_names", ()))
    out: dict[str, float] = {}
    for names, eta in zip(groups, info["eta"]):
        for name in names:
            out[name] = float(eta)
    return out


def plot_eta_history(
    histories: Mapping[str, Mapping[str, Any]],
    *,
    title: str = "",
    data_range: Mapping[str, float] | Any = None,
    image_size: int | None = None,
    fig: Figure | None = None,
) -> Figure:
    """η per generator over training, in human units, and ELBO/N, for one or more runs.

    Args:
        histories: run label -> ``FitResult.history`` (``step``, ``elbo``, ``eta``: generator
            name -> one value per logged step).
        title: figure title.
        data_range: the data's true η per generator (``{"rot": π}``), or a transformed dataset
            (read with :func:`data_eta_range`); drawn as dashed lines in each run's colour.
        image_size: image side in pixels: translations are then shown in pixels.
        fig: an empty figure to draw into (default: a new one).

    Returns the figure: one panel per kind of generator (rotation in degrees with a dotted line at 180° = all of
    SO(2); translation in half image sides or pixels; scale as the largest factor e^η; shear;
    any other symmetry parameter -- λ, generator norms, layer-wise precisions -- as is, on a
    log axis when positive and spanning over two decades), and one for the smoothed ELBO/N.
    """
    if data_range is not None and not isinstance(data_range, Mapping):
        data_range = data_eta_range(data_range)
    data_range = dict(data_range or {})
    panels: dict[str, tuple[str, list]] = {}  # title -> (y label, [(label, name, steps, values)])
    for label, hist in histories.items():
        for name, values in hist.get("eta", {}).items():
            kind, ylabel = _UNITS.get(name, ("other symmetry parameters", "value"))
            if name in ("tx", "ty") and image_size:
                ylabel = "η (pixels)"
            panels.setdefault(kind, (ylabel, []))[1].append((label, name, hist["step"], np.asarray(values, float)))
    n = len(panels) + 1
    fig = fig if fig is not None else plt.figure(figsize=(4.6 * n, 3.6))
    axes = list(fig.subplots(1, n, squeeze=False)[0])
    for ax, (kind, (ylabel, lines)) in zip(axes, panels.items()):
        for i, (label, name, steps, values) in enumerate(lines):
            colour = f"C{i % 10}"
            ax.plot(steps, _human(name, values, image_size), color=colour, label=f"{label}: η_{name}")
            if name in data_range:
                level = float(_human(name, np.array([data_range[name]]), image_size)[0])
                ax.axhline(level, color=colour, ls="--", lw=1, label=f"data: η_{name} = {level:.3g}")
        if kind == "rotation":
            ax.axhline(180.0, color="grey", ls=":", lw=1, label="all of SO(2)")
        if kind == "other symmetry parameters":
            every = np.concatenate([v for *_, v in lines])
            if (every > 0).all() and every.max() / every.min() > 100:
                ax.set_yscale("log")
        ax.set(xlabel="step", ylabel=ylabel, title=kind)
        ax.legend(fontsize=7)
    ax_elbo = axes[-1]
    for label, hist in histories.items():
        ax_elbo.plot(hist["step"], _smooth(hist["elbo"]), label=label)
    ax_elbo.set(xlabel="step", ylabel="ELBO / N (smoothed)", title="bound")
    if ax_elbo.get_legend_handles_labels()[0]:
        ax_elbo.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_filter_bank(
    model: Any, *, rows: Sequence[int] = (0, 1, 2, 3), num: int = 7, fig: Figure | None = None
) -> Figure:
    """First-layer rows of W1 warped over ε ∈ [-1, 1] (paper 003, Fig. 3): one row of panels per
    hidden unit in ``rows``, ``num`` columns of ε; needs ``model.filter_bank`` (an InvariantMLP).

    For an RFF model W1 is fixed random noise, so this shows the transforms but not what η learned
    on the data: see :func:`plot_orbits` with input images. ``fig``: an empty figure to draw into.
    """
    bank = model.filter_bank(rows, num=num)  # (R, num, C, h, w)
    fig = fig if fig is not None else plt.figure(figsize=(1.2 * num, 1.2 * len(rows)))
    axes = fig.subplots(len(rows), num, squeeze=False)
    for r in range(len(rows)):
        limit = float(bank[r].abs().max()) or 1.0
        for j in range(num):
            img = bank[r, j]
            img = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
            axes[r][j].imshow(img.cpu().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
            axes[r][j].axis("off")
    fig.suptitle("filter bank, η: " + _eta_text(model.eta, model.generator_names, int(bank.shape[-1])))
    fig.tight_layout()
    return fig


def plot_orbits(
    model: InvariantMLP, x: Any = None, *, num: int = 5, steps: int = 7, fig: Figure | None = None
) -> Figure:
    """What the learned η does: filters or images moved along the model's learned orbit.

    Each row is one image warped by ``T(ε) = expm(Σᵢ ε ηᵢ Gᵢ)`` (every generator of the model's
    subgroup moved by the same ε, as in :meth:`InvariantMLP.filter_bank`), one column per
    ε ∈ ``linspace(−1, 1, steps)``: the ε = ±1 columns are the ends of the learned range, ε = 0 is
    the identity, so with η = 0 all columns are equal. The rows are:

    * ``x`` given: its first ``num`` images -- what the model averages each input over;
    * ``x`` left out (ReLU models): the first ``num`` rows of the learned first layer W1 as images.
      An RFF model's W1 is fixed random noise, which shows the transforms but not what was learned,
      so it needs ``x``.

    Warping uses the model's own :func:`~pyro_invariance.symmetry.affine.transform_weight_rows`
    (``out(p) = in(T p)``), at the model's ``eta`` and ``generators``. One colour scale per row:
    grey for images, blue < 0 < red for filters. The title gives η in human units
    (:func:`~pyro_invariance.symmetry.affine.eta_to_human`).

    Args:
        model: an :class:`~pyro_invariance.models.InvariantMLP` (``eta``, ``generators``,
            ``generator_names``, ``image_shape`` ``(C, H, W)``, ``w1`` ``(hidden, C·H·W)``).
        x: ``(N, C, H, W)`` or ``(N, C·H·W)`` images (tensor or array), e.g. ``data.x_train``.
        num: rows shown (the first ``num`` images or filters).
        steps: columns (values of ε).
        fig: an empty figure to draw into (default: a new one).

    Returns:
        The figure, ``num × steps`` panels (fewer rows if ``x`` has fewer images).

    Raises:
        ValueError: an RFF model without ``x``, ``x`` of the wrong shape or empty, or ``num`` or
            ``steps`` below 1.
    """
    if not isinstance(model, InvariantMLP):
        raise TypeError(f"plot_orbits draws an InvariantMLP's orbits, got {type(model).__name__}")
    if num < 1 or steps < 1:
        raise ValueError(f"num and steps must be at least 1, got num={num}, steps={steps}")
    shape = tuple(int(v) for v in model.image_shape)
    if x is None:
        if model.activation == "rff":
            raise ValueError(
                "an RFF model's first layer is fixed random features, which do not show what η learned: "
                "give input images x of shape (N, C, H, W), e.g. data.x_train"
            )
        rows, label = model.w1.detach()[:num], "filter"
    else:
        images = torch.as_tensor(x.detach().cpu() if hasattr(x, "detach") else np.asarray(x), dtype=torch.float32)
        if tuple(images.shape[1:]) not in (shape, (math.prod(shape),)) or images.shape[0] == 0:
            want = ", ".join(map(str, shape))
            raise ValueError(f"x must have shape (N, {want}) with N >= 1, got {tuple(images.shape)}")
        rows, label = images.reshape(images.shape[0], -1)[:num], "image"
    eta = model.eta.detach().to("cpu", torch.float32)
    grid = torch.linspace(-1, 1, steps)
    eps = grid.unsqueeze(-1).expand(steps, eta.shape[0])  # (steps, k): all generators moved together
    with torch.no_grad():
        transforms = lie_exp(eta, eps, model.generators.detach().to("cpu", torch.float32))
        warped = transform_weight_rows(rows.to("cpu", torch.float32), transforms, shape)  # (steps, R, C·H·W)
    warped = warped.transpose(0, 1).reshape(rows.shape[0], steps, *shape).numpy()
    fig = fig if fig is not None else plt.figure(figsize=(1.15 * steps, 1.2 * len(warped) + 0.5))
    axes = fig.subplots(len(warped), steps, squeeze=False)
    for r, row in enumerate(warped):
        limit = float(np.abs(row).max()) or 1.0
        lo, hi = (float(row.min()), float(row.max())) if label == "image" else (-limit, limit)
        for ax, img, e in zip(axes[r], row, grid.tolist()):
            if img.shape[0] == 1:
                ax.imshow(img[0], cmap="gray_r" if label == "image" else "RdBu_r", vmin=lo, vmax=hi)
            else:  # colour: channels last; filters mapped to [0, 1] with 0 at grey
                rgb = img.transpose(1, 2, 0)
                ax.imshow(np.clip(rgb if label == "image" else rgb / (2 * limit) + 0.5, 0, 1))
            ax.set(xticks=[], yticks=[])
            if r == 0:
                ax.set_title(f"ε = {round(e, 2) + 0.0:+.2f}", fontsize=8)  # + 0.0: no "-0.00"
        axes[r][0].set_ylabel(f"{label} {r}", fontsize=8)
    kind = "learned" if model.learn_symmetry else "fixed"
    fig.suptitle(f"orbits, {kind} η: " + _eta_text(eta, model.generator_names, shape[-1]), fontsize=10)
    fig.tight_layout()
    return fig


def plot_filter_banks(
    sites: Mapping[str, Any],
    *,
    block: int = 0,
    image_shape: Sequence[int] | None = None,
    kernel_size: int = 3,
    max_filters: int = 16,
    max_units: int = 8,
    title: str = "",
    fig: Figure | None = None,
) -> Figure:
    """The learned filters of one block of a layer-wise model (``layerwise-*``).

    Args:
        sites: site name -> value, e.g. ``guide.median()`` or one posterior draw. Read:
            ``blocks.<block>.conv.weight`` of shape ``(C_out, C_in·k²)`` (each row a C_in × k × k
            filter) and, if ``image_shape`` is given, ``blocks.<block>.fc.weight`` of shape
            ``(C_out·H·W, C_in·H·W)`` (each row the receptive field of one output unit; rows
            channel-major, the block's output map assumed H × W, i.e. stride 1 as in block 0).
        block: which block.
        image_shape: ``(C_in, H, W)`` of the block's input, to show FC receptive fields.
        kernel_size: k.
        max_filters: conv filters shown (the first ones).
        max_units: FC output units shown (channel 0, positions spread over the map).
        title: figure title.
        fig: an empty figure to draw into (default: a new one).

    Returns the figure, up to 8 panels a row. Each panel shares one symmetric colour scale per
    pathway (blue < 0 < red), so a pathway whose precision δ grew large (switched off by the
    bound) shows up as faded.

    Raises:
        ValueError: neither site present, or a weight whose shape does not fit.
    """
    panels: list[tuple[str, np.ndarray, float]] = []
    conv_key, fc_key = f"blocks.{block}.conv.weight", f"blocks.{block}.fc.weight"
    if conv_key in sites:
        w = _numpy(sites[conv_key])
        k2 = kernel_size * kernel_size
        if w.ndim != 2 or w.shape[1] % k2:
            raise ValueError(f"{conv_key} has shape {w.shape}; expected (C_out, C_in·{k2})")
        c_in = w.shape[1] // k2
        filters = w[:max_filters].reshape(-1, c_in, kernel_size, kernel_size)
        limit = float(np.abs(filters).max()) or 1.0
        panels += [(f"conv {i}", _mosaic(f), limit) for i, f in enumerate(filters)]
    if fc_key in sites and image_shape is not None:
        c_in, h, w_ = (int(s) for s in image_shape)
        w = _numpy(sites[fc_key])
        if w.ndim != 2 or w.shape[1] != c_in * h * w_ or w.shape[0] % (h * w_):
            raise ValueError(f"{fc_key} has shape {w.shape}; expected (C_out·{h}·{w_}, {c_in}·{h}·{w_})")
        positions = np.unique(np.linspace(0, h * w_ - 1, min(max_units, h * w_)).round().astype(int))
        fields = w[positions].reshape(-1, c_in, h, w_)  # output channel 0 (rows are channel-major)
        limit = float(np.abs(fields).max()) or 1.0
        panels += [(f"fc unit ({p // w_},{p % w_})", _mosaic(f), limit) for p, f in zip(positions, fields)]
    if not panels:
        raise ValueError(f"no {conv_key!r} (or {fc_key!r} with image_shape) among the sites: {sorted(sites)[:8]}...")
    cols = min(8, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = fig if fig is not None else plt.figure(figsize=(1.3 * cols, 1.45 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (name, img, limit) in zip(axes.flat, panels):
        ax.imshow(img, cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set_title(name, fontsize=7)
    fig.suptitle(title or f"block {block} filters")
    fig.tight_layout()
    return fig


def plot_generators(
    eta: Mapping[str, float],
    *,
    image: Any = None,
    num_examples: int = 5,
    title: str = "",
    fig: Figure | None = None,
) -> Figure:
    """The learned affine generator ``A = Σ ηᵢGᵢ`` and what it does to an image.

    Left: the vector field ``v(p) = A [p; 1]`` on the image plane (normalised coordinates
    p ∈ [−1, 1]², x = column, y = row pointing down, as displayed), i.e. the direction in which
    each point moves under the map ``p ↦ expm(εA) p`` as ε grows. Right (if ``image`` is given): the
    image warped by ``T = expm(εA)`` for ``num_examples`` values of ε ∈ [−1, 1] -- the orbit the
    model averages over (paper 003, Eq. 3). With the ``transform_images`` convention
    ``out(p) = image(T p)`` the picture's content moves against the arrows for ε > 0.

    Args:
        eta: generator name -> η (``FitResult.eta`` of an InvariantMLP), names from
            :data:`pyro_invariance.symmetry.affine.GENERATOR_NAMES`.
        image: ``(C, H, W)`` or ``(H, W)`` example image (tensor or array), optional.
        num_examples: images along the orbit.
        title: figure title (default: η in human units).
        fig: an empty figure to draw into (default: a new one).

    Returns the figure: the vector field, then ``num_examples`` image panels if ``image`` is given.

    Raises:
        ValueError: an unknown generator name.
    """
    unknown = [k for k in eta if k not in GENERATOR_NAMES]
    if unknown:
        raise ValueError(f"unknown generators {unknown}; expected names from {GENERATOR_NAMES}")
    basis = affine_generators(dtype=torch.float64)
    algebra = sum(
        (float(v) * basis[GENERATOR_NAMES.index(k)] for k, v in eta.items()), torch.zeros(3, 3, dtype=torch.float64)
    )
    n_img = num_examples if image is not None else 0
    fig = fig if fig is not None else plt.figure(figsize=(3.6 + 1.6 * n_img, 3.6))
    axes = list(fig.subplots(1, 1 + n_img, squeeze=False, gridspec_kw={"width_ratios": [2.2] + [1] * n_img})[0])
    grid = np.linspace(-1, 1, 13)
    px, py = np.meshgrid(grid, grid)
    a = algebra.numpy()
    u = a[0, 0] * px + a[0, 1] * py + a[0, 2]
    v = a[1, 0] * px + a[1, 1] * py + a[1, 2]
    ax = axes[0]
    ax.quiver(px, py, u, v, np.hypot(u, v), cmap="viridis", angles="xy")
    ax.set(xlim=(-1.15, 1.15), ylim=(1.15, -1.15), aspect="equal", xlabel="x (column)", ylabel="y (row)")
    ax.set_title("A = Σ ηᵢGᵢ", fontsize=9)
    if image is not None:
        img = torch.as_tensor(np.asarray(image), dtype=torch.float32)
        img = img[None] if img.dim() == 2 else img  # (C, H, W)
        eps = torch.linspace(-1, 1, num_examples, dtype=torch.float64)
        mats = torch.linalg.matrix_exp(eps[:, None, None] * algebra)
        warped = transform_images(img.expand(num_examples, *img.shape).contiguous(), mats.to(torch.float32))
        for axi, e, w in zip(axes[1:], eps.tolist(), warped):
            shown = w[0] if w.shape[0] == 1 else w.permute(1, 2, 0).clamp(0, 1)
            axi.imshow(shown.numpy(), cmap="gray_r" if w.shape[0] == 1 else None)
            axi.set_title(f"ε = {e:+.2f}", fontsize=8)
            axi.axis("off")
    size = None if image is None else int(np.shape(image)[-1])
    fig.suptitle(title or "learned generator: " + _eta_text(list(eta.values()), list(eta), size), fontsize=10)
    fig.tight_layout()
    return fig


def plot_conserved_quantities(
    generators: Any,
    *,
    dims: tuple[int, int] = (0, 1),
    extent: float = 2.0,
    max_panels: int = 6,
    titles: Sequence[str] | None = None,
    title: str = "",
    fig: Figure | None = None,
) -> Figure:
    """Noether's razor: level sets of each conserved quantity and the flow it generates.

    For each generator ``G = [[JA, Jb], [0, 0]]`` (:mod:`pyro_invariance.symmetry.conserved`), the quantity
    ``C(x) = xᵀAx/2 + bᵀx`` on the plane of phase-space coordinates ``dims`` (the others at 0), as
    contours, with the symmetry's flow ``ẋ = J∇C(x) = G [x; 1]`` as arrows (tangent to the
    contours). For the SHO the learned quantity should show circles (energy / SO(2)).

    Args:
        generators: ``(K, M+1, M+1)`` tensor, or a model with ``generators()``
            (:class:`~pyro_invariance.models.symmetrised_hnn.SymmetrisedHNN`).
        dims: the two coordinates spanning the plane (``q_i`` is ``i < M/2``, ``p_i`` after).
        extent: the plane is ``[−extent, extent]²``.
        max_panels: at most this many generators (the first ones).
        titles: one title per generator (default ``C_k``).
        title: figure title.
        fig: an empty figure to draw into (default: a new one).

    Returns the figure, one panel per generator shown.

    Raises:
        ValueError: no generators, or ``dims`` out of range.
    """
    g = generators.generators() if callable(getattr(generators, "generators", None)) else generators
    g = torch.as_tensor(g).detach().to(torch.float64).cpu()
    if g.dim() != 3 or g.shape[0] == 0:
        raise ValueError(f"need generators of shape (K, M+1, M+1) with K >= 1, got {tuple(g.shape)}")
    m = g.shape[-1] - 1
    i, j = dims
    if not (0 <= i < m and 0 <= j < m and i != j):
        raise ValueError(f"dims must be two different coordinates of 0..{m - 1}, got {dims}")
    a, b = quadratic_from_generator(g[:max_panels])
    k = a.shape[0]
    fig = fig if fig is not None else plt.figure(figsize=(3.4 * k, 3.3))
    axes = fig.subplots(1, k, squeeze=False)
    grid = torch.linspace(-extent, extent, 61, dtype=torch.float64)
    gx, gy = torch.meshgrid(grid, grid, indexing="xy")
    x = torch.zeros(*gx.shape, m, dtype=torch.float64)
    x[..., i], x[..., j] = gx, gy
    coarse = slice(None, None, 6)
    for n, ax in enumerate(axes[0]):
        c = 0.5 * torch.einsum("...i,ij,...j->...", x, a[n], x) + x @ b[n]
        vel = x @ g[n, :m, :m].T + g[n, :m, m]
        if float(c.max() - c.min()) > 1e-12 * max(1.0, float(c.abs().max())):
            ax.contour(gx.numpy(), gy.numpy(), c.numpy(), levels=12, cmap="viridis", linewidths=1)
        else:
            ax.text(0.5, 0.5, "constant on this plane", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        u, v = vel[coarse, coarse, i], vel[coarse, coarse, j]
        if float(torch.hypot(u, v).max()) > 0:  # no flow within the plane: nothing to draw
            ax.quiver(
                gx[coarse, coarse].numpy(), gy[coarse, coarse].numpy(), u.numpy(), v.numpy(), color="0.4", angles="xy"
            )
        ax.set(xlim=(-extent, extent), ylim=(-extent, extent))
        ax.set(aspect="equal", xlabel=_phase_name(i, m), ylabel=_phase_name(j, m))
        ax.set_title(titles[n] if titles else f"C_{n}", fontsize=9)
    fig.suptitle(title or f"conserved quantities on the ({_phase_name(i, m)}, {_phase_name(j, m)}) plane")
    fig.tight_layout()
    return fig


def _eta_text(eta: Any, names: Sequence[str], image_size: int | None) -> str:
    """η in human units for a title: ``"rot ±90.0°, tx ±1.75 px"`` (``"no symmetry"`` without generators)."""
    human = eta_to_human(eta, names, image_size=image_size)
    return ", ".join(f"{k} {v}" for k, v in human.items()) or "no symmetry"


def _phase_name(i: int, m: int) -> str:
    d = m // 2
    return f"q{i}" if i < d else f"p{i - d}"


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _mosaic(filt: np.ndarray) -> np.ndarray:
    """(C, h, w) -> (h, C·(w+1)−1): channels side by side, separated by a blank column."""
    c, h, w = filt.shape
    out = np.full((h, c * (w + 1) - 1), np.nan)
    for k in range(c):
        out[:, k * (w + 1) : k * (w + 1) + w] = filt[k]
    return out


def _smooth(values: Sequence[float], window: int = 25) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 110, **savefig_kwargs: Any) -> Path:
    """Write ``fig`` to ``path`` (folders are created), close it (``plt.close``) and return the path.

    For scripts that make many figures: a figure that is saved and closed is not kept by pyplot.
    ``savefig_kwargs`` go to :meth:`~matplotlib.figure.Figure.savefig` (e.g. ``bbox_inches="tight"``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, **savefig_kwargs)
    plt.close(fig)
    return path


def model_figures(model: Any, data: Any = None) -> dict[str, Figure]:
    """A fitted model's own figures, name -> ``Figure``; the CLI saves each as ``<name>.png`` beside
    the run.

    An :class:`~pyro_invariance.models.invariant_mlp.InvariantMLP`: ``"filters"``, the filter bank
    (paper 003, Fig. 3; :func:`plot_filter_bank`), and ``"orbits"``, the first 5 training images of
    ``data`` (a dataset or ``(x, y)``) moved along the learned orbit (:func:`plot_orbits`). An RFF
    model's fixed random filters show the transforms, not what η learned, so without ``data`` it
    has no orbit figure; a ReLU model shows its first learned filters. A latent η has no single
    value: no figures (plot ``q(η)`` with ``az.plot_posterior(pi.to_inference_data(...),
    var_names=["eta"])``). Other models: none.
    """
    if not isinstance(model, InvariantMLP) or model.eta_is_latent:
        return {}
    out = {"filters": plot_filter_bank(model)}
    if model.activation != "rff":
        out["orbits"] = plot_orbits(model)
    elif data is not None:
        out["orbits"] = plot_orbits(model, train_arrays(data, model)[0][:5])
    return out
