"""Affine symmetry groups: Lie-algebra generators, transform sampling and warping.

Paper 003 (van der Ouderaa & van der Wilk, UAI 2022), Section 3.3, Eq. 3: a transformation is::

    T = expm(Σ_i ε_i η_i G_i),    ε ~ U[-1, 1]^k,

with six 3×3 generators acting on ``F.affine_grid`` normalised coordinates (x = column, y = row,
both in [-1, 1]), in the order ``[tx, ty, rot, sx, sy, shear]`` (docs/methods.md §1)::

    tx: (0,2)=1   ty: (1,2)=1   rot: [[0,-1],[1,0]]   sx: (0,0)=1   sy: (1,1)=1   shear: [[0,1],[1,0]]

Units: translation η = 1 is half the image side, rotation is in radians (η_rot = π is all of
SO(2)), scale is log-scale. η = 0 is the identity (no invariance).

Warping convention: ``transform_images(x, T)`` returns the image whose pixel at normalised
coordinate p is ``x(T p)`` (the ``affine_grid`` convention). For the rotation generator with
angle θ > 0 the picture turns counter-clockwise as displayed (y axis pointing down), exactly
torchvision's ``rotate(x, degrees(θ))`` up to interpolation (tested).
The sampling distributions used here are symmetric in ε, so the sign never changes a model.

Warping many images by the same S transforms (the rows of a weight matrix, or a batch of inputs
that share the S transforms of one forward pass) is one ``grid_sample`` call with batch 1:
:func:`warp_stack` stacks the S sampling grids along the height axis and treats the images as
channels, so nothing is copied S times and the gradient to the grids is summed inside the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

GENERATOR_NAMES: tuple[str, ...] = ("tx", "ty", "rot", "sx", "sy", "shear")

#: Named subgroups; any "+"-joined combination of these names or of generator names also works.
SUBGROUPS: dict[str, tuple[str, ...]] = {
    "none": (),
    "translation": ("tx", "ty"),
    "rotation": ("rot",),
    "scale": ("sx", "sy"),
    "shear": ("shear",),
    "affine": GENERATOR_NAMES,
}

#: Largest meaningful η per generator (the constraint's upper bound). Rotation is capped at π
#: (full SO(2)); translation at 1 (half the image side), log-scale at ln 4, shear at 1.
DEFAULT_ETA_MAX: dict[str, float] = {
    "tx": 1.0,
    "ty": 1.0,
    "rot": math.pi,
    "sx": math.log(4.0),
    "sy": math.log(4.0),
    "shear": 1.0,
}


def affine_generators(dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """The six affine Lie-algebra generators, shape ``(6, 3, 3)``, in :data:`GENERATOR_NAMES` order."""
    g = torch.zeros(6, 3, 3, dtype=dtype, device=device)
    g[0, 0, 2] = 1.0  # tx
    g[1, 1, 2] = 1.0  # ty
    g[2, 0, 1], g[2, 1, 0] = -1.0, 1.0  # rot
    g[3, 0, 0] = 1.0  # sx
    g[4, 1, 1] = 1.0  # sy
    g[5, 0, 1], g[5, 1, 0] = 1.0, 1.0  # shear (symmetric)
    return g


def resolve_subgroup(spec: str | Sequence[str]) -> tuple[str, ...]:
    """Generator names of a subgroup.

    ``spec`` is a subgroup name (``"rotation"``, ``"affine"``, ...), a "+"-joined combination
    (``"rotation+scale"``, ``"tx+rot"``) or a sequence of such names. The result keeps the
    canonical generator order and has no repeats. Unknown names raise ``ValueError``.
    """
    parts: Iterable[str] = spec.split("+") if isinstance(spec, str) else spec
    chosen: set[str] = set()
    for raw in parts:
        part = raw.strip()
        if part in SUBGROUPS:
            chosen.update(SUBGROUPS[part])
        elif part in GENERATOR_NAMES:
            chosen.add(part)
        else:
            known = ", ".join(list(SUBGROUPS) + list(GENERATOR_NAMES))
            raise ValueError(f"unknown symmetry {part!r}; known subgroups and generators: {known}")
    return tuple(n for n in GENERATOR_NAMES if n in chosen)


def generator_indices(names: Sequence[str]) -> list[int]:
    """Positions of generator ``names`` in :data:`GENERATOR_NAMES`."""
    return [GENERATOR_NAMES.index(n) for n in names]


def eta_upper_bounds(names: Sequence[str], overrides: dict[str, float] | None = None) -> Tensor:
    """Upper bounds of η for the given generators, shape ``(k,)``."""
    caps = dict(DEFAULT_ETA_MAX, **(overrides or {}))
    return torch.tensor([caps[n] for n in names], dtype=torch.float32)


def sample_epsilon(
    num_samples: int,
    dim: int,
    mode: str = "stochastic",
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Noise ε for Eq. 3, shape ``(S, k)``.

    ``mode="stochastic"``: ε ~ U[-1, 1]^k i.i.d. (paper 003, Eq. 6).
    ``mode="deterministic"``: a linspace grid over [-1, 1]^k (Section 3.4, "quadrature"); with
    k > 1 the grid has m = round(S^(1/k)) points per axis, so S' = m^k rows (curse of
    dimensionality, as the paper warns).
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if dim < 0:
        raise ValueError(f"dim must be >= 0, got {dim}")
    if mode == "stochastic":
        u = torch.rand(num_samples, dim, generator=generator, dtype=dtype, device=device)
        return 2.0 * u - 1.0
    if mode == "deterministic":
        if dim == 0:
            return torch.zeros(num_samples, 0, dtype=dtype, device=device)
        per_axis = max(1, round(num_samples ** (1.0 / dim)))
        axis = (
            torch.linspace(-1.0, 1.0, per_axis, dtype=dtype, device=device)
            if per_axis > 1
            else torch.zeros(1, dtype=dtype, device=device)
        )
        grids = torch.meshgrid(*([axis] * dim), indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=-1)
    raise ValueError(f"unknown sampling mode {mode!r}; use 'stochastic' or 'deterministic'")


def lie_exp(eta: Tensor, eps: Tensor, generators: Tensor) -> Tensor:
    """T = expm(Σ_i ε_i η_i G_i) for each row of ε (Eq. 3).

    Args:
        eta: ``(k,)`` invariance parameters.
        eps: ``(S, k)`` noise.
        generators: ``(k, 3, 3)`` generators matching ``eta``.

    Returns:
        ``(S, 3, 3)`` affine matrices (bottom row ``[0, 0, 1]``).
    """
    if eps.shape[-1] != eta.shape[-1] or generators.shape[0] != eta.shape[-1]:
        raise ValueError(
            f"shape mismatch: eta {tuple(eta.shape)}, eps {tuple(eps.shape)}, generators {tuple(generators.shape)}"
        )
    algebra = torch.einsum("sk,kij->sij", eps * eta, generators)
    return torch.linalg.matrix_exp(algebra)


def _check_images(images: Tensor) -> None:
    if images.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")


def transform_images(images: Tensor, matrices: Tensor, mode: str = "bilinear", padding_mode: str = "zeros") -> Tensor:
    """Warp images with affine matrices (``affine_grid`` + ``grid_sample``, align_corners=True).

    Args:
        images: ``(N, C, H, W)``.
        matrices: ``(N, 3, 3)`` (one per image) or ``(3, 3)`` (shared); only the top 2×3 is used.

    Returns:
        ``(N, C, H, W)`` with ``out(p) = images(T p)`` in normalised coordinates.
    """
    _check_images(images)
    n = images.shape[0]
    if matrices.dim() == 2:
        matrices = matrices.expand(n, 3, 3)
    if matrices.shape != (n, 3, 3):
        raise ValueError(f"matrices must have shape ({n}, 3, 3) or (3, 3), got {tuple(matrices.shape)}")
    theta = matrices[:, :2, :].to(images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=True)
    return F.grid_sample(images, grid, mode=mode, padding_mode=padding_mode, align_corners=True)


def warp_stack(images: Tensor, matrices: Tensor) -> Tensor:
    """Warp each of ``N`` images by each of ``S`` shared affine transforms (bilinear, zero padding).

    One ``grid_sample`` call with batch 1: the ``N·C`` image channels are the channels and the S
    sampling grids of ``F.affine_grid`` are stacked along the output height, so no input is
    expanded S times (the ``(S·N, C, h, w)`` copy that a batched call needs) and the gradient to
    the grids (hence to η) is accumulated over the channels by the kernel. Per output pixel the
    arithmetic is the same as :func:`transform_images`' (tested equal).

    Args:
        images: ``(N, C, h, w)``.
        matrices: ``(S, 3, 3)`` transforms (only the top 2×3 is used).

    Returns:
        ``(N, S, C, h, w)`` with ``out[n, s](p) = images[n](T_s p)``; contiguous when ``C == 1``,
        otherwise a transposed view of an ``(N, C, S, h, w)`` tensor.
    """
    _check_images(images)
    if matrices.dim() != 3 or matrices.shape[-2:] != (3, 3):
        raise ValueError(f"matrices must have shape (S, 3, 3), got {tuple(matrices.shape)}")
    n, c, h, w = images.shape
    s = matrices.shape[0]
    theta = matrices[:, :2, :].to(images.dtype)
    grid = F.affine_grid(theta, [s, 1, h, w], align_corners=True).reshape(1, s * h, w, 2)
    out = F.grid_sample(
        images.reshape(1, n * c, h, w), grid, mode="bilinear", padding_mode="zeros", align_corners=True
    )  # (1, N·C, S·h, w)
    return out.reshape(n, c, s, h, w).transpose(1, 2)


def transform_weight_rows(weight: Tensor, matrices: Tensor, image_shape: Sequence[int], layout: str = "shd") -> Tensor:
    """Apply S transforms to every row of a first-layer weight matrix viewed as an image.

    Paper 003, Section 3.2: each row of W1 (length C·h·w) is a C×h×w image, warped by each
    transform (``out(p) = row(T p)``) with one :func:`warp_stack` call.

    Args:
        weight: ``(H, C*h*w)`` weight rows.
        matrices: ``(S, 3, 3)`` transforms.
        image_shape: ``(C, h, w)``.
        layout: ``"shd"`` (default): a contiguous ``(S, H, C*h*w)`` tensor; ``"hsd"``: ``(H, S, C*h*w)``,
            the layout :func:`warp_stack` produces, free of a copy for ``C == 1`` (the fast path of
            :class:`~pyro_invariance.models.InvariantMLP`, which multiplies it as an ``(H·S, D)`` matrix).

    Returns:
        ``(S, H, C*h*w)`` or ``(H, S, C*h*w)`` transformed rows.
    """
    c, h, w = image_shape
    hidden, d = weight.shape
    if d != c * h * w:
        raise ValueError(f"weight rows have length {d}, which is not C*h*w = {c}*{h}*{w}")
    if layout not in ("shd", "hsd"):
        raise ValueError(f"unknown layout {layout!r}; use 'shd' or 'hsd'")
    out = warp_stack(weight.reshape(hidden, c, h, w), matrices)  # (H, S, C, h, w)
    s = out.shape[1]
    if layout == "hsd":
        return out.reshape(hidden, s, d)
    return out.transpose(0, 1).reshape(s, hidden, d).contiguous()


def invert_affine(matrices: Tensor) -> Tensor:
    """Inverse of affine matrices ``[[A, t], [0, 1]]`` → ``[[A⁻¹, −A⁻¹t], [0, 1]]``, shape ``(..., 3, 3)``.

    Closed form for the 2×2 block (differentiable; exact up to rounding, unlike a general solver).
    For ``T = expm(Σ εᵢηᵢGᵢ)`` this is ``expm(−Σ εᵢηᵢGᵢ)``.
    """
    a, b = matrices[..., 0, 0], matrices[..., 0, 1]
    c, d = matrices[..., 1, 0], matrices[..., 1, 1]
    tx, ty = matrices[..., 0, 2], matrices[..., 1, 2]
    det = a * d - b * c
    ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
    zero, one = torch.zeros_like(a), torch.ones_like(a)
    rows = [
        torch.stack([ia, ib, -(ia * tx + ib * ty)], dim=-1),
        torch.stack([ic, id_, -(ic * tx + id_ * ty)], dim=-1),
        torch.stack([zero, zero, one], dim=-1),
    ]
    return torch.stack(rows, dim=-2)


def affine_det(matrices: Tensor) -> Tensor:
    """``det A`` of the linear 2×2 block of affine matrices ``(..., 3, 3)``, shape ``(...)``: the
    factor by which ``p ↦ T p`` scales areas (``exp(Σ εᵢηᵢ tr Gᵢ)`` for ``T = expm(Σ εᵢηᵢGᵢ)``;
    1 for translation, rotation and shear, whose generators are trace-free)."""
    return matrices[..., 0, 0] * matrices[..., 1, 1] - matrices[..., 0, 1] * matrices[..., 1, 0]


def eta_to_human(eta: Tensor | Sequence[float], names: Sequence[str], image_size: int | None = None) -> dict[str, str]:
    """Readable η: rotation in degrees, translation in pixels (or image fraction), scale as factor.

    ``image_size`` is the side in pixels (square images); translation η = 1 is half the side,
    i.e. (size - 1) / 2 pixels between pixel centres with ``align_corners=True``.
    """
    values = [float(v) for v in (eta.detach().cpu().tolist() if isinstance(eta, Tensor) else eta)]
    out: dict[str, str] = {}
    for name, v in zip(names, values):
        if name == "rot":
            out[name] = f"±{math.degrees(v):.1f}°"
        elif name in ("tx", "ty"):
            out[name] = f"±{v * (image_size - 1) / 2:.2f} px" if image_size else f"±{v / 2:.2f} of the side"
        elif name in ("sx", "sy"):
            out[name] = f"×{math.exp(-v):.2f}…×{math.exp(v):.2f}"
        else:
            out[name] = f"±{v:.3f}"
    return out
