"""Relaxed-equivariance layers of ELLA (paper 004) as Pyro modules.

*Learning Layer-wise Equivariances Automatically using Gradients* (van der Ouderaa, Immer and
van der Wilk, NeurIPS 2023; ``papers/004``, docs/methods.md §3) relaxes translation (and p4 rotation)
equivariance by summing *pathways* with their own priors: a layer is strictly equivariant in the
limit where the prior precision δ of every non-equivariant pathway goes to ∞ (Eq. 8), and the
precisions are hyperparameters learnt by model selection.

Feature maps are 5-D, ``(B, C, G, H, W)``: ``G = 1`` for plain images, ``G = 4`` for p4 feature
maps (one copy per 90° rotation). Every pathway maps ``(B, C, G, H, W)`` to
``(B, C', G', H', W')``:

============  ===================================================================  ===================
kind          pathway                                                              equivariant
============  ===================================================================  ===================
``"fc"``      :class:`FullyConnected` — dense ``C'G'H'W' × CGHW`` (Eq. 1)          no
``"conv"``    :class:`Convolution` — 3×3, circular padding (Eq. 3)                 translations
``"ffc"``     :class:`FactoredFullyConnected` — θ₁(c′,c,q)·θ₂(c′,c,p) (Eq. 5)      no
``"sconv"``   :class:`SparseConvolution` — RBF-interpolated 3×3 filter (Eq. 6)     translations
``"sfc"``     :class:`SparseFullyConnected` — sparse θ₁, θ₂ (Eq. 7)                no
``"gconv"``   :class:`GroupConvolution` — p4 lift / group conv (App. A)            translations, rot90
============  ===================================================================  ===================

Equivariant pathways compute their output at stride 1; :class:`RelaxedBlock` subsamples their sum
by **per-example polyphase selection** (Chaman & Dokmanić, 2021: of the four components
``y[..., a::2, b::2]`` keep, for each example, the one with the largest ℓ2 norm over channels,
group and space), which keeps circular-shift equivariance up to the polyphase choice. The
non-equivariant pathways map straight to the output resolution (their parameter counts are the
paper's, Table 2). The pathways are summed with weight ``1/√K`` (K pathways; the reference's
``½(FC + CONV)`` up to a constant that δ absorbs, chosen so the prior's activation scale does not
depend on K), a per-channel bias is added and a ReLU follows.

Priors (Eq. 8). Every pathway tensor θ is its own sample site, declared as a 2-D matrix
``Normal(0, δ^{-1/2}).expand([rows, cols]).to_event(2)`` so that the matrix-normal and
block-Cholesky guides structure it, and has its own precision δ (``prior="learned"``: a
:class:`~pyro.nn.PyroParam` point estimate, type-II maximum likelihood as in the paper;
``"hierarchical"``: a ``LogNormal`` sample site; ``"fixed"``: a constant). The weights enter the
layer **standardised**: ``w = θ·√(2/fan_in)`` (He scaling), so δ = 1 is a well-scaled prior for any
layer size and a guide initialised at N(0, 1) starts as a well-scaled random network. δ is
therefore the precision of θ; the paper's precision of the raw weights w is ``δ·fan_in/2``.
Biases: the fully-connected pathway's position-dependent bias (``C'G'H'W'``, like ``nn.Linear``'s)
shares the FC weight's δ — it breaks equivariance too and must vanish with it; the per-channel
block bias has its own δ.

Shapes of the sample sites (K = C'G' output channels, rows; columns = inputs):

* fc:    ``weight (C'G'H'W', CGHW)``, ``bias (C'G'H'W',)``
* conv:  ``weight (C'G', CG·9)``
* ffc:   ``weight_out (C'G', CG·H'W')`` (θ₁), ``weight_in (C'G', CG·HW)`` (θ₂)
* sconv: ``weight (C'G', CG·M)`` — the anchor values u (M anchors)
* sfc:   ``weight_out (C'G', CG·M_out)``, ``weight_in (C'G', CG·M_in)`` — anchor values
* gconv: ``weight (C', C·9)`` (lifting, G = 1) or ``(C', C·4·9)`` (group conv, G = 4)

Sparse layers (Eqs. 6–7): weights on the grid are ``W = u·(K_ZZ + σ²I)⁻¹K_ZT`` with an RBF kernel
``k(a, b) = s²·exp(−‖a − b‖²/(2ω²))`` (s = 1, ω = 1 px, σ = 0.01) between fixed anchors Z — a
seeded random subset of the grid points — and the grid T (:func:`rbf_interpolation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample
from torch import Tensor

from pyro_invariance.weight_priors import add_prior_scale

__all__ = [
    "PRIORS",
    "PRECISION_NAMES",
    "PATHWAYS",
    "BlockSpec",
    "LayerOptions",
    "PathwayLayer",
    "FullyConnected",
    "Convolution",
    "FactoredFullyConnected",
    "SparseConvolution",
    "SparseFullyConnected",
    "GroupConvolution",
    "RelaxedBlock",
    "BayesianLinear",
    "circular_conv2d",
    "circular_pad",
    "polyphase_components",
    "polyphase_select",
    "polyphase_take",
    "grid_coordinates",
    "rbf_interpolation",
    "choose_anchors",
    "p4_lift_filters",
    "p4_group_filters",
]

#: Prior options for the precisions δ.
PRIORS: tuple[str, ...] = ("learned", "hierarchical", "fixed")

#: p4: the number of 90° rotations.
P4 = 4
KERNEL = 3  # every convolution is 3×3


# ------------------------------------------------------------------------------------------------
# functional pieces: circular convolution, polyphase selection, RBF interpolation, p4 filters


class _CircularPad(torch.autograd.Function):
    """``F.pad(x, (p, p, p, p), mode="circular")`` with a lean backward.

    The forward is ``F.pad``'s. Its autograd backward scatters the padded gradient through a
    dozen slice copies and full-size zero tensors; here the gradient of the input is the interior
    of the padded gradient plus the wrapped borders, added in place: two copies and four slice
    additions (on CPU bit-identical to ``F.pad``'s gradient; ``tests/symmetry/test_equivariant_layers.py``).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: int) -> Tensor:
        ctx.p = p
        return F.pad(x, (p, p, p, p), mode="circular")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        p = ctx.p
        rows = grad[..., p:-p, :].clone()  # (…, H, W + 2p)
        rows[..., :p, :] += grad[..., -p:, :]  # bottom padding wraps to the first rows
        rows[..., -p:, :] += grad[..., :p, :]  # top padding wraps to the last rows
        out = rows[..., p:-p].clone()  # (…, H, W)
        out[..., :p] += rows[..., -p:]
        out[..., -p:] += rows[..., :p]
        return out, None


def circular_pad(x: Tensor, p: int) -> Tensor:
    """Circular padding of the last two dims by ``p`` (``F.pad(..., mode="circular")``; cheaper backward)."""
    if p == 0:
        return x
    if not torch.is_grad_enabled() or not x.requires_grad:
        return F.pad(x, (p, p, p, p), mode="circular")
    return _CircularPad.apply(x, p)


def circular_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Cross-correlation with circular padding (exactly equivariant to circular shifts).

    Args:
        x: ``(B, C, H, W)``.
        weight: ``(C', C, k, k)`` with odd ``k``.
        bias: optional ``(C',)``, added to every position.
    Returns:
        ``(B, C', H, W)``.
    """
    return F.conv2d(circular_pad(x, weight.shape[-1] // 2), weight, bias)


def polyphase_components(x: Tensor) -> Tensor:
    """The four stride-2 polyphase components of ``x`` ``(B, ..., H, W)`` (H, W even).

    Returns ``(B, 4, ..., H/2, W/2)``; component ``2a + b`` is ``x[..., a::2, b::2]``.
    """
    h, w = x.shape[-2:]
    if h % 2 or w % 2:
        raise ValueError(f"polyphase stride 2 needs even height and width, got {h}×{w}")
    return torch.stack([x[..., a::2, b::2] for a in (0, 1) for b in (0, 1)], dim=1)


def _polyphase_view(x: Tensor) -> Tensor:
    """``x (B, ..., H, W)`` viewed as ``(B, M, H/2, 2, W/2, 2)``: component ``2a + b`` is ``[:, :, :, a, :, b]``."""
    h, w = x.shape[-2:]
    if h % 2 or w % 2:
        raise ValueError(f"polyphase stride 2 needs even height and width, got {h}×{w}")
    return x.reshape(x.shape[0], -1, h // 2, 2, w // 2, 2)


def _take(view: Tensor, index: Tensor, shape: torch.Size) -> Tensor:
    """One gather (and one scatter in the backward) instead of stacking all four components."""
    rows = torch.arange(view.shape[0], device=view.device)
    out = view[rows, :, :, index // 2, :, index % 2]  # (B, M, H/2, W/2)
    return out.reshape(*shape[:-2], shape[-2] // 2, shape[-1] // 2)


def polyphase_take(x: Tensor, index: Tensor) -> Tensor:
    """Component ``index[n]`` of example ``n``: ``(B, ..., H, W)``, ``(B,)`` → ``(B, ..., H/2, W/2)``."""
    return _take(_polyphase_view(x), index, x.shape)


def polyphase_select(x: Tensor) -> tuple[Tensor, Tensor]:
    """Adaptive polyphase sampling per example (Chaman & Dokmanić, 2021).

    For each example keep the polyphase component with the largest ℓ2 norm over all its
    non-batch dims (first one on ties). A circular shift of ``x`` permutes the components and
    shifts them by at most one (half-resolution) pixel, so the output of a shifted input is a
    circular shift of the output — equivariance holds for every shift, not only even ones.

    The norms are summed in the order of the stacked components (:func:`polyphase_components`),
    outside autograd; the chosen component is gathered directly from ``x``.

    Args:
        x: ``(B, ..., H, W)`` with even H, W.
    Returns:
        ``(y, index)``: ``y (B, ..., H/2, W/2)`` and the chosen components ``index (B,)``.
    """
    view = _polyphase_view(x)
    with torch.no_grad():
        comps = view.permute(0, 3, 5, 1, 2, 4).contiguous().view(x.shape[0], 4, -1)  # component-major
        index = comps.square().sum(-1).argmax(dim=1)
    return _take(view, index, x.shape), index


def grid_coordinates(h: int, w: int, *, centred: bool = False, dtype: torch.dtype = torch.float64) -> Tensor:
    """Pixel coordinates of an ``h × w`` grid in row-major order, ``(h·w, 2)`` (row, column);
    ``centred=True`` puts the origin at the grid's centre (filter offsets)."""
    rows, cols = torch.meshgrid(torch.arange(h, dtype=dtype), torch.arange(w, dtype=dtype), indexing="ij")
    out = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1)
    if centred:
        out = out - torch.tensor([(h - 1) / 2, (w - 1) / 2], dtype=dtype)
    return out


def rbf_interpolation(
    anchors: Tensor,
    targets: Tensor,
    *,
    lengthscale: float = 1.0,
    variance: float = 1.0,
    noise: float = 0.01,
) -> Tensor:
    """Interpolation matrix ``B = (K_ZZ + σ²I)⁻¹ K_ZT`` of an RBF kernel, ``(M, T)``.

    Anchor values ``u (…, M)`` give values ``u @ B`` at the targets (the posterior mean of a
    GP through the anchors; paper 004 Eqs. 6–7 with the kernel
    ``k(a, b) = variance·exp(−‖a − b‖²/(2·lengthscale²))``). Computed in float64.

    Args:
        anchors: ``(M, 2)`` anchor positions Z.
        targets: ``(T, 2)`` positions T at which weights are needed.
        noise: σ (the jitter is σ²).
    """
    z, t = anchors.double(), targets.double()

    def k(a: Tensor, b: Tensor) -> Tensor:
        return variance * torch.exp(-torch.cdist(a, b).square() / (2.0 * lengthscale**2))

    kzz = k(z, z) + noise**2 * torch.eye(z.shape[0], dtype=torch.float64)
    return torch.linalg.solve(kzz, k(z, t))


def choose_anchors(num_points: int, num_anchors: int, seed: int) -> Tensor:
    """A seeded random subset of ``num_anchors`` of ``num_points`` grid indices (sorted)."""
    if not 1 <= num_anchors <= num_points:
        raise ValueError(f"need 1 <= num_anchors <= {num_points}, got {num_anchors}")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randperm(num_points, generator=gen)[:num_anchors].sort().values


def p4_lift_filters(weight: Tensor) -> Tensor:
    """Lifting filters: ``(C', C, k, k)`` → ``(C'·4, C, k, k)``; output channel ``4c′ + r`` is
    the filter rotated by ``r·90°``. Rotating the input by 90° then rotates each output map and
    shifts the group index by one (p4-equivariance)."""
    bank = torch.stack([torch.rot90(weight, r, dims=(-2, -1)) for r in range(P4)], dim=1)
    return bank.reshape(-1, *weight.shape[1:])


def p4_group_filters(weight: Tensor) -> Tensor:
    """p4 group-convolution filters: ``(C', C, 4, k, k)`` → ``(C'·4, C·4, k, k)``.

    Output rotation ``r`` uses ``ψ_r[c′, c, s] = rot90(ψ[c′, c, s − r], r)`` (cyclic in s), so
    that rotating the input (spatially, and its group axis by one) rotates the output the same
    way. Channels are ordered ``4c + s`` (input) and ``4c′ + r`` (output).
    """
    c_out, c_in, g, k, _ = weight.shape
    bank = torch.stack(
        [torch.rot90(torch.roll(weight, shifts=r, dims=2), r, dims=(-2, -1)) for r in range(P4)], dim=1
    )  # (C', 4_r, C, 4_s, k, k)
    return bank.reshape(c_out * P4, c_in * g, k, k)


# ------------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True)
class LayerOptions:
    """Settings of the sparse layers shared by a network.

    Attributes:
        sconv_anchors: anchors M of a sparse 3×3 filter (paper: 7 of 9; 4 inside S-FC+S-CONV).
        sfc_anchor_fraction: fraction of the grid used as anchors by S-FC (paper: half, rounded up).
        rbf_lengthscale, rbf_variance, rbf_noise: ω (px), s², σ of :func:`rbf_interpolation`.
        anchor_seed: seed of the random (fixed) anchor subsets.
    """

    sconv_anchors: int = 7
    sfc_anchor_fraction: float = 0.5
    rbf_lengthscale: float = 1.0
    rbf_variance: float = 1.0
    rbf_noise: float = 0.01
    anchor_seed: int = 0

    def __post_init__(self) -> None:
        if (
            isinstance(self.sconv_anchors, bool)
            or not isinstance(self.sconv_anchors, int)
            or not (1 <= self.sconv_anchors <= KERNEL * KERNEL)
        ):
            raise ValueError(f"sconv_anchors must be an integer in [1, 9], got {self.sconv_anchors!r}")
        if not (0 < float(self.sfc_anchor_fraction) <= 1):
            raise ValueError(f"sfc_anchor_fraction must lie in (0, 1], got {self.sfc_anchor_fraction!r}")
        for name in ("rbf_lengthscale", "rbf_variance"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not (math.isfinite(float(self.rbf_noise)) and float(self.rbf_noise) >= 0):
            raise ValueError(f"rbf_noise must be a finite number >= 0, got {self.rbf_noise!r}")

    def sfc_anchors(self, num_points: int) -> int:
        """Anchors of an S-FC factor on a grid of ``num_points`` points: ``⌈fraction·points⌉``."""
        return max(1, math.ceil(self.sfc_anchor_fraction * num_points - 1e-9))


@dataclass(frozen=True)
class BlockSpec:
    """Sizes of one block: ``(B, c_in, g_in, h_in, w_in)`` → ``(B, c_out, g_out, h_out, w_out)``.

    ``g`` is the group axis (1, or 4 for p4 feature maps); ``stride`` is 1 or 2.
    """

    index: int
    c_in: int
    g_in: int
    h_in: int
    w_in: int
    c_out: int
    g_out: int
    stride: int

    @property
    def h_out(self) -> int:
        return self.h_in // self.stride

    @property
    def w_out(self) -> int:
        return self.w_in // self.stride

    @property
    def in_channels(self) -> int:
        """Flattened input channels ``c_in·g_in``."""
        return self.c_in * self.g_in

    @property
    def out_channels(self) -> int:
        """Flattened output channels ``c_out·g_out``."""
        return self.c_out * self.g_out

    @property
    def in_size(self) -> int:
        return self.c_in * self.g_in * self.h_in * self.w_in

    @property
    def out_size(self) -> int:
        return self.c_out * self.g_out * self.h_out * self.w_out


# ------------------------------------------------------------------------------------------------
# precisions


def _check_prior(prior: str) -> None:
    if prior not in PRIORS:
        raise ValueError(f"unknown prior {prior!r}; use one of {PRIORS}")


def add_precision(module: PyroModule, name: str, prior: str, init: float, hyperprior_scale: float) -> None:
    """Give ``module`` a prior precision δ called ``name``.

    ``"learned"``: ``PyroParam`` (positive, init ``init``); ``"hierarchical"``: sample site
    ``δ ~ LogNormal(log init, hyperprior_scale)``; ``"fixed"``: a buffer
    (:func:`pyro_invariance.weight_priors.add_prior_scale`, with δ as the scale it declares).
    """
    _check_prior(prior)
    add_prior_scale(module, name, prior, init, hyperprior_scale=hyperprior_scale)


def _normal_site(precision_name: str, shape: tuple[int, ...]) -> PyroSample:
    """``θ ~ N(0, δ⁻¹ I)`` declared with event dim ``len(shape)`` (2 for weight matrices)."""

    def prior(m: PyroModule) -> dist.TorchDistribution:
        scale = getattr(m, precision_name).rsqrt()
        # loc made on scale's device (a Python 0.0 would be copied from the host, a sync on CUDA)
        return dist.Normal(scale.new_zeros(()), scale).expand(list(shape)).to_event(len(shape))

    return PyroSample(prior)


# ------------------------------------------------------------------------------------------------
# pathways


class PathwayLayer(PyroModule):
    """A pathway of a relaxed layer: weight sample sites, their precisions and the linear map.

    Subclasses define ``kind``, ``equivariant``, ``weights`` (site attribute -> precision
    attribute), optional ``biases`` (same) and :meth:`site_shapes`. ``forward`` maps
    ``(B, c_in, g_in, h, w)`` to ``(B, c_out, g_out, h, w)`` (equivariant pathways, stride 1) or
    ``(B, c_out, g_out, h_out, w_out)`` (the others).
    """

    kind: ClassVar[str] = ""
    equivariant: ClassVar[bool] = False
    #: weight site attribute -> the precision attribute that scales its prior
    weights: ClassVar[dict[str, str]] = {"weight": "precision"}
    #: bias site attribute -> the precision attribute it shares
    biases: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        spec: BlockSpec,
        options: LayerOptions,
        *,
        prior: str = "learned",
        precision_init: float = 1.0,
        hyperprior_scale: float = 3.0,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.options = options
        shapes = self.site_shapes(spec, options)
        for precision in dict.fromkeys(self.weights.values()):
            add_precision(self, precision, prior, precision_init, hyperprior_scale)
        for site, precision in {**self.weights, **self.biases}.items():
            setattr(self, site, _normal_site(precision, shapes[site]))

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        """Shapes of the pathway's sample sites (weights first), computed without building it."""
        raise NotImplementedError

    @classmethod
    def num_params(cls, spec: BlockSpec, options: LayerOptions) -> int:
        """Number of elements of all sample sites (weights and biases)."""
        return sum(math.prod(s) for s in cls.site_shapes(spec, options).values())

    def precision_values(self) -> Tensor:
        """Current δ of each weight site, in the order of ``weights``, ``(len(weights),)``."""
        return torch.stack([getattr(self, p).detach().reshape(()) for p in self.weights.values()])


class FullyConnected(PathwayLayer):
    """Dense layer from the whole input map to the whole output map (paper 004 Eq. 1).

    ``y(c′, q) = Σ_{c,p} x(c, p)·w(c′, q, c, p) + b(c′, q)`` with ``w = θ·√(2/CGHW)``; maps
    straight to the output resolution (stride included). Sites: ``weight (C'G'H'W', CGHW)``,
    ``bias (C'G'H'W',)`` (sharing δ: a position-dependent bias is not equivariant either).
    """

    kind = "fc"
    biases = {"bias": "precision"}

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        return {"weight": (spec.out_size, spec.in_size), "bias": (spec.out_size,)}

    def forward(self, x: Tensor) -> Tensor:
        s = self.spec
        gain = math.sqrt(2.0 / s.in_size)
        y = x.reshape(x.shape[0], -1) @ (self.weight * gain).T + self.bias
        return y.reshape(x.shape[0], s.c_out, s.g_out, s.h_out, s.w_out)

    def scaled(self, x: Tensor, scale: float) -> Tensor:
        """``scale·forward(x)`` as ``(B, C'G'H'W')``; the scales multiply the input (``B × CGHW``),
        not the ``C'G'H'W' × CGHW`` weight, and product and bias are one ``F.linear``."""
        weight = self.weight  # sites in the order of forward: weight, then bias
        bias = self.bias if scale == 1.0 else self.bias * scale
        return F.linear(x.reshape(x.shape[0], -1) * (math.sqrt(2.0 / self.spec.in_size) * scale), weight, bias)


class Convolution(PathwayLayer):
    """3×3 convolution with circular padding, exactly equivariant to circular shifts (Eq. 3).

    Channels include the group axis (``CG → C'G'``): a plain convolution of p4 feature maps is
    translation- but not rotation-equivariant. Site ``weight (C'G', CG·9)``; ``w = θ·√(2/(CG·9))``.
    Output at stride 1: ``(B, C', G', H, W)``.
    """

    kind = "conv"
    equivariant = True

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        return {"weight": (spec.out_channels, spec.in_channels * KERNEL * KERNEL)}

    def filters(self, scale: float = 1.0) -> Tensor:
        """Effective filters ``(C'G', CG, 3, 3)`` (He scale included), times ``scale``."""
        s = self.spec
        gain = math.sqrt(2.0 / (s.in_channels * KERNEL * KERNEL)) * scale
        return (self.weight * gain).reshape(s.out_channels, s.in_channels, KERNEL, KERNEL)

    def forward(self, x: Tensor) -> Tensor:
        s = self.spec
        b, _, _, h, w = x.shape
        y = circular_conv2d(x.reshape(b, s.in_channels, h, w), self.filters())
        return y.reshape(b, s.c_out, s.g_out, h, w)


class FactoredFullyConnected(PathwayLayer):
    """Factored fully-connected layer F-FC (paper 004 Eq. 5), two einsums.

    ``y(c′, q) = Σ_c θ₁(c′, c, q) Σ_p x(c, p)·θ₂(c′, c, p)`` with ``q`` the output and ``p`` the
    input positions (channels include the group axis). ``2·C'C·HW`` parameters instead of
    ``C'C·H²W²``. Sites ``weight_out`` = θ₁ ``(C'G', CG·H'W')`` and ``weight_in`` = θ₂
    ``(C'G', CG·HW)``, each with its own δ; scales ``√(2/CG)`` and ``1/√(HW)``. No bias.
    """

    kind = "ffc"
    weights = {"weight_out": "precision_out", "weight_in": "precision_in"}

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        q, p = spec.h_out * spec.w_out, spec.h_in * spec.w_in
        return {
            "weight_out": (spec.out_channels, spec.in_channels * q),
            "weight_in": (spec.out_channels, spec.in_channels * p),
        }

    def factors(self, scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """Effective ``θ₁ (C'G', CG, H'W')`` and ``θ₂ (C'G', CG, HW)`` (scales included; θ₁ also
        times ``scale``)."""
        s = self.spec
        k, c = s.out_channels, s.in_channels
        theta1 = self.weight_out.reshape(k, c, -1) * (math.sqrt(2.0 / c) * scale)
        theta2 = self.weight_in.reshape(k, c, -1) / math.sqrt(s.h_in * s.w_in)
        return theta1, theta2

    def forward(self, x: Tensor) -> Tensor:
        return self.scaled(x, 1.0).reshape(
            x.shape[0], self.spec.c_out, self.spec.g_out, self.spec.h_out, self.spec.w_out
        )

    def scaled(self, x: Tensor, scale: float) -> Tensor:
        """``scale·forward(x)`` as ``(B, C'G', H'W')`` (``scale`` folded into θ₁)."""
        return _factored(x, *self.factors(scale), self.spec.in_channels)


def _factored(x: Tensor, theta1: Tensor, theta2: Tensor, in_channels: int) -> Tensor:
    """F-FC / S-FC product ``y(b, c′, q) = Σ_c θ₁(c′, c, q) Σ_p x(b, c, p)·θ₂(c′, c, p)``, ``(B, C'G', H'W')``."""
    z = torch.einsum("bcp,kcp->bkc", x.reshape(x.shape[0], in_channels, -1), theta2)
    return torch.einsum("bkc,kcq->bkq", z, theta1)


def _anchor_basis(h: int, w: int, num_anchors: int, seed: int, options: LayerOptions, centred: bool) -> Tensor:
    """Interpolation matrix ``(M, h·w)`` from a seeded random subset of ``num_anchors`` grid points."""
    grid = grid_coordinates(h, w, centred=centred)
    idx = choose_anchors(grid.shape[0], num_anchors, seed)
    basis = rbf_interpolation(
        grid[idx],
        grid,
        lengthscale=options.rbf_lengthscale,
        variance=options.rbf_variance,
        noise=options.rbf_noise,
    )
    return basis


def _mean_variance(basis: Tensor) -> float:
    """Average prior variance of an interpolated weight per unit anchor variance, mean_t Σ_m B_mt²."""
    return float(basis.square().sum(0).mean())


class SparseConvolution(PathwayLayer):
    """Sparse 3×3 convolution S-CONV (paper 004 Eq. 6): filters interpolated from M anchors.

    ``filter(c′, c, ·) = u(c′, c, ·)·(K_ZZ + σ²I)⁻¹K_ZT`` with Z a fixed seeded subset of the 3×3
    offsets (``options.sconv_anchors``, default 7) and T all 9. Site ``weight (C'G', CG·M)`` holds the
    anchor values u. Scale ``√(2/(CG·9·v̄))`` with ``v̄ = mean_t Σ_m B_mt²``. With all 9 anchors
    and σ → 0 it is exactly :class:`Convolution`.
    """

    kind = "sconv"
    equivariant = True

    def __init__(self, spec: BlockSpec, options: LayerOptions, **kwargs: float | str) -> None:
        super().__init__(spec, options, **kwargs)  # type: ignore[arg-type]
        basis = _anchor_basis(KERNEL, KERNEL, options.sconv_anchors, _seed(options, spec, 0), options, True)
        self.register_buffer("basis", basis.float())
        self.scale = math.sqrt(2.0 / (spec.in_channels * KERNEL * KERNEL * _mean_variance(basis)))

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        return {"weight": (spec.out_channels, spec.in_channels * options.sconv_anchors)}

    def filters(self, scale: float = 1.0) -> Tensor:
        """Effective filters ``(C'G', CG, 3, 3)`` (scale included), times ``scale``."""
        s = self.spec
        u = self.weight.reshape(s.out_channels, s.in_channels, -1)
        return (u @ self.basis * (self.scale * scale)).reshape(s.out_channels, s.in_channels, KERNEL, KERNEL)

    forward = Convolution.forward  # the circular convolution with these filters


class SparseFullyConnected(PathwayLayer):
    """Sparse factored fully-connected layer S-FC (paper 004 Eq. 7).

    F-FC whose spatial factors are interpolated from anchors: ``θ₁ = u₁·B_out`` over the output
    grid (``⌈½·H'W'⌉`` anchors by default) and ``θ₂ = u₂·B_in`` over the input grid
    (``⌈½·HW⌉``). Sites ``weight_out (C'G', CG·M_out)``, ``weight_in (C'G', CG·M_in)`` (anchor
    values, own δ each). No bias.
    """

    kind = "sfc"
    weights = {"weight_out": "precision_out", "weight_in": "precision_in"}

    def __init__(self, spec: BlockSpec, options: LayerOptions, **kwargs: float | str) -> None:
        super().__init__(spec, options, **kwargs)  # type: ignore[arg-type]
        m_out, m_in = self._anchors(spec, options)
        b_out = _anchor_basis(spec.h_out, spec.w_out, m_out, _seed(options, spec, 1), options, False)
        b_in = _anchor_basis(spec.h_in, spec.w_in, m_in, _seed(options, spec, 2), options, False)
        self.register_buffer("basis_out", b_out.float())
        self.register_buffer("basis_in", b_in.float())
        self.scale_out = math.sqrt(2.0 / (spec.in_channels * _mean_variance(b_out)))
        self.scale_in = math.sqrt(1.0 / (spec.h_in * spec.w_in * _mean_variance(b_in)))

    @staticmethod
    def _anchors(spec: BlockSpec, options: LayerOptions) -> tuple[int, int]:
        return options.sfc_anchors(spec.h_out * spec.w_out), options.sfc_anchors(spec.h_in * spec.w_in)

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        m_out, m_in = cls._anchors(spec, options)
        return {
            "weight_out": (spec.out_channels, spec.in_channels * m_out),
            "weight_in": (spec.out_channels, spec.in_channels * m_in),
        }

    def factors(self, scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """Effective ``θ₁ (C'G', CG, H'W')`` and ``θ₂ (C'G', CG, HW)`` (scales included; θ₁ also
        times ``scale``)."""
        k, c = self.spec.out_channels, self.spec.in_channels
        theta1 = self.weight_out.reshape(k, c, -1) @ self.basis_out * (self.scale_out * scale)
        theta2 = self.weight_in.reshape(k, c, -1) @ self.basis_in * self.scale_in
        return theta1, theta2

    # F-FC's product with these factors
    forward, scaled = FactoredFullyConnected.forward, FactoredFullyConnected.scaled


class GroupConvolution(PathwayLayer):
    """p4 group convolution GCONV (paper 004 App. A; Cohen & Welling, 2016), circular padding.

    Equivariant to circular shifts and to 90° rotations of square maps. From plain maps
    (``g_in = 1``) it *lifts*: output rotation r uses the filter rotated by r·90°
    (:func:`p4_lift_filters`, site ``weight (C', C·9)``); from p4 maps (``g_in = 4``) filters are
    rotated and cyclically shifted along the input group axis (:func:`p4_group_filters`, site
    ``weight (C', C·4·9)``). Output ``(B, C', 4, H, W)``; scale ``√(2/(C·g_in·9))``.
    """

    kind = "gconv"
    equivariant = True

    def __init__(self, spec: BlockSpec, options: LayerOptions, **kwargs: float | str) -> None:
        if spec.g_out != P4 or spec.g_in not in (1, P4):
            raise ValueError(f"GCONV maps G = 1 or 4 to G = 4, got {spec.g_in} -> {spec.g_out}")
        if spec.h_in != spec.w_in:
            raise ValueError(f"GCONV (rot90) needs square feature maps, got {spec.h_in}×{spec.w_in}")
        super().__init__(spec, options, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def site_shapes(cls, spec: BlockSpec, options: LayerOptions) -> dict[str, tuple[int, ...]]:
        return {"weight": (spec.c_out, spec.c_in * spec.g_in * KERNEL * KERNEL)}

    def filters(self, scale: float = 1.0) -> Tensor:
        """The expanded filter bank ``(C'·4, C·g_in, 3, 3)`` (scale included), times ``scale``."""
        s = self.spec
        theta = self.weight * (math.sqrt(2.0 / (s.in_channels * KERNEL * KERNEL)) * scale)
        if s.g_in == 1:
            return p4_lift_filters(theta.reshape(s.c_out, s.c_in, KERNEL, KERNEL))
        return p4_group_filters(theta.reshape(s.c_out, s.c_in, P4, KERNEL, KERNEL))

    forward = Convolution.forward  # the circular convolution with the filter bank (g_out = 4)


#: Pathway classes by kind.
PATHWAYS: dict[str, type[PathwayLayer]] = {
    cls.kind: cls
    for cls in (
        FullyConnected,
        Convolution,
        FactoredFullyConnected,
        SparseConvolution,
        SparseFullyConnected,
        GroupConvolution,
    )
}


def _seed(options: LayerOptions, spec: BlockSpec, which: int) -> int:
    return int(options.anchor_seed) * 1_000_003 + 101 * spec.index + which


# ------------------------------------------------------------------------------------------------
# blocks and the head


class RelaxedBlock(PyroModule):
    """One relaxed layer: pathways summed, polyphase stride, per-channel bias, ReLU.

    ``y = ReLU( (1/√K)·[ P(Σ_equivariant f_k(x)) + Σ_other f_k(x) ] + b )`` where P is the
    per-example polyphase selection (:func:`polyphase_select`) when ``stride = 2`` and the
    identity otherwise; ``b (C',)`` is the site ``bias`` with its own precision ``bias_precision``
    (shared over the group axis, so it keeps every equivariance).

    Computed as (equal to the formula up to float rounding; ``tests/symmetry/test_equivariant_layers.py``
    keeps the direct formula as a reference): the equivariant pathways are all 3×3 circular
    convolutions of the same input, so their filters are summed and convolved once; 1/√K is folded
    into the (small) filters and F-FC/S-FC output factors θ₁ and into the FC input; at stride 1
    the bias is the convolution's bias (at stride 2 it is added after the polyphase selection,
    which it would otherwise change). Sample sites are visited in the order of the formula:
    equivariant pathways, other pathways (each in ``kinds`` order), bias.

    Args:
        spec: block sizes.
        kinds: pathway kinds (keys of :data:`PATHWAYS`), e.g. ``("fc", "conv")``.
        options: sparse-layer settings.
        prior, precision_init, hyperprior_scale: see :func:`add_precision`.
    """

    def __init__(
        self,
        spec: BlockSpec,
        kinds: tuple[str, ...],
        options: LayerOptions,
        *,
        prior: str = "learned",
        precision_init: float = 1.0,
        hyperprior_scale: float = 3.0,
    ) -> None:
        super().__init__()
        unknown = [k for k in kinds if k not in PATHWAYS]
        if unknown or not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds must be distinct pathway kinds from {sorted(PATHWAYS)}, got {kinds}")
        if spec.stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {spec.stride}")
        self.spec = spec
        self.kinds = tuple(kinds)
        kw = dict(prior=prior, precision_init=precision_init, hyperprior_scale=hyperprior_scale)
        for kind in self.kinds:
            setattr(self, kind, PATHWAYS[kind](spec, options, **kw))
        self._equivariant = tuple(k for k in self.kinds if PATHWAYS[k].equivariant)
        self._others = tuple(k for k in self.kinds if not PATHWAYS[k].equivariant)
        add_precision(self, "bias_precision", prior, precision_init, hyperprior_scale)
        self.bias = _normal_site("bias_precision", (spec.c_out,))

    def pathway(self, kind: str) -> PathwayLayer:
        return getattr(self, kind)

    @property
    def equivariant_kinds(self) -> tuple[str, ...]:
        """The kinds of the equivariant pathways (summed, then polyphase-selected at stride 2)."""
        return self._equivariant

    def forward(self, x: Tensor) -> Tensor:
        s = self.spec
        b = x.shape[0]
        scale = 1.0 / math.sqrt(len(self.kinds))  # exactly 1.0 for one pathway
        filters = None
        for kind in self._equivariant:
            f = self.pathway(kind).filters(scale)
            filters = f if filters is None else filters + f
        others = [
            self.pathway(kind).scaled(x, scale).reshape(b, s.c_out, s.g_out, s.h_out, s.w_out) for kind in self._others
        ]
        bias = self.bias
        total = None
        if filters is not None:
            fused = s.stride == 1
            conv_bias = (bias if s.g_out == 1 else bias[:, None].expand(-1, s.g_out).reshape(-1)) if fused else None
            y = circular_conv2d(x.reshape(b, s.in_channels, s.h_in, s.w_in), filters, conv_bias)
            total = y.reshape(b, s.c_out, s.g_out, s.h_in, s.w_in)
            if s.stride == 2:
                total, _ = polyphase_select(total)
        else:
            fused = False
        for y in others:
            total = y if total is None else total + y
        assert total is not None
        if not fused:
            total = total + bias.reshape(1, -1, 1, 1, 1)
        return F.relu(total)


class BayesianLinear(PyroModule):
    """Dense read-out layer ``y = x wᵀ + b``, ``w = θ·√(gain/in)``; sites ``weight (out, in)`` and
    ``bias (out,)`` share one precision ``precision``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        gain: float = 2.0,
        prior: str = "learned",
        precision_init: float = 1.0,
        hyperprior_scale: float = 3.0,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.scale = math.sqrt(gain / in_features)
        add_precision(self, "precision", prior, precision_init, hyperprior_scale)
        self.weight = _normal_site("precision", (out_features, in_features))
        self.bias = _normal_site("precision", (out_features,))

    @staticmethod
    def site_shapes(in_features: int, out_features: int) -> dict[str, tuple[int, ...]]:
        return {"weight": (out_features, in_features), "bias": (out_features,)}

    def forward(self, x: Tensor) -> Tensor:
        return x @ (self.weight * self.scale).T + self.bias


#: Leaf attribute names of all precisions δ (the networks' ``symmetry_parameters()`` are the learned
#: ones, so that :func:`pyro_invariance.fit` trains them with ``eta_lr``).
PRECISION_NAMES: tuple[str, ...] = ("precision", "precision_out", "precision_in", "bias_precision")
