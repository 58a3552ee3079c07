"""Layer-wise relaxed equivariance: ELLA's networks (paper 004) as catalogue entries ``layerwise-*``.

*Learning Layer-wise Equivariances Automatically using Gradients* (van der Ouderaa, Immer and
van der Wilk, NeurIPS 2023; ``papers/004``, docs/methods.md §3). Every layer is a sum of pathways —
fully-connected (FC), convolutional (CONV), factored (F-FC), sparse (S-FC, S-CONV), p4 group
convolution (GCONV) — each with its own prior precision δ. A layer becomes strictly equivariant
when δ of its non-equivariant pathways → ∞ (Eq. 8); the δ are learnt by model selection (the
paper maximises a Laplace marginal likelihood, Eq. 9; here the ELBO). The layers live in
:mod:`pyro_invariance.symmetry.equivariant_layers`.

Generative story (x an image ``(C, H, W)``, α the width)::

    channels  α, 2α, 2α, 4α, 4α, 8α, 8α, 16α;   strides 1, 2, 1, 2, 1, 2, 2, 2   (paper App. F)
    block l:  δ_{l,k}  precision of pathway tensor k        ("learned": point estimate, init prior_scale⁻² = 1;
                                                             "hierarchical": δ ~ LogNormal(0, 3);
                                                             "fixed": constant)
              θ_{l,k} ~ N(0, δ_{l,k}⁻¹ I)                    one 2-D matrix site per tensor
              b_l ~ N(0, δ_{l,b}⁻¹ I)   (C'_l,)              per-channel bias
              h_l = ReLU( (1/√K)·[P(Σ_equivariant f_k(h_{l−1})) + Σ_other f_k(h_{l−1})] + b_l )
                    (f_k: Eqs. 1, 3, 5, 6, 7 / App. A; P: per-example polyphase selection at stride 2)
    head:     z = flatten(h_8)   (GCONV variants: max over the rotation axis first)
              W₁ ~ N(0, δ₈⁻¹ I) (64α × 16α·H₈W₈),  W₂ ~ N(0, δ₉⁻¹ I) (classes × 64α)  (+ biases)
              logits = W₂ ReLU(W₁ z + b₁) + b₂ ;     y_n ~ Categorical(logits)  in plate "data"

No BatchNorm. Weights enter standardised (``w = θ·√(2/fan_in)``), so δ is the precision of θ; the
paper's precision of raw weights is ``δ·fan_in/2`` (see the layers module).

Variants (``variant`` = pathway tokens joined by ``+``; registered as ``layerwise-<variant>``):
``fc``, ``conv``, ``fc+conv`` (Eq. 4), ``f-fc+conv`` (the paper's model), ``s-fc+s-conv`` and
``fc+conv+gconv`` (App. B: choosing among FC / CONV / GCONV; all feature maps carry a p4 axis).
:class:`LayerwiseNet` accepts any combination of ``fc``, ``conv``, ``f-fc``, ``s-fc``, ``s-conv``,
``gconv``. Parameter counts at α = 10 on 3×32×32 with 10 classes (:func:`count_parameters`):
FC 133.6M, CONV 0.34M, FC+CONV 133.9M, F-FC 1.54M, F-FC+CONV 1.77M, S-FC+S-CONV 0.93M — the
paper's Table 2 (this fixes the design: FC pathways carry an ``nn.Linear``-style bias per output
unit, factored ones none; S-FC uses ⌈½⌉ of each grid as anchors, S-CONV 4 of 9 inside
S-FC+S-CONV, else 7).

Strides: ``strides="auto"`` (default) takes the paper's strides and turns the last stride-2 blocks
into stride 1 until the total stride divides the input (32×32 → the paper's 1,2,1,2,1,2,2,2;
16×16 → 1,2,1,2,1,2,2,1; 28×28 → 1,2,1,2,1,1,1,1); explicit strides must divide the input.

Guides. Every weight site is a 2-D matrix, so ``matrix-normal`` (rows = output units) and
``block-cholesky`` structure them; ``mean-field`` and ``map`` work as usual. Recommended for the
matrix-normal guide: ``guides.get("matrix-normal", model, diagonal_factors=512)`` (Kronecker
factors larger than 512 are diagonal — a dense FC site at 16×16 has 512 × 256 rows × columns).
With ``prior="learned"`` the MAP objective is degenerate (δ → ∞ with θ → 0); with the ``map``
guide use ``prior="fixed"``.

Two ways to learn δ.

* **Laplace evidence (the paper's objective; recommended for symmetry selection).** Build with
  ``prior="fixed"`` (δ become buffers) and call :func:`pyro_invariance.infer.laplace.fit_laplace` (CLI:
  ``pyro-invariance fit --objective laplace``): MAP steps on the weights, and every 50 steps the
  diagonal-GGN Laplace evidence sets each δ by MacKay's update. Measured on 16×16 quadrant digits
  (α = 2, 200 steps, seed 0; ``tests/infer/test_laplace.py``): FC+CONV 59.1% vs CONV 55.6% on the
  10-class task and 44.9% vs 8.2% on the 40-class task; δ_FC rose from 1 to 45–412 in all 8 blocks
  on the digit task (``benchmarks/results/layerwise_table1.md`` has the 300-step table).
* **The ELBO** (``prior="learned"``, a density guide, :func:`pyro_invariance.fit`): δ are point
  estimates trained with ``eta_lr``. At these sizes (0.4M weights, 1347 images) the KL of the
  weights dominates the bound: with fast δ (``eta_lr=0.1``, or the closed-form optimum
  δ = P/E_q‖θ‖² after every step) every δ grew and the network collapsed to the prior predictive
  (chance accuracy); with ``eta_lr=1e-3`` (:data:`FIT_DEFAULTS`) δ move by tens of percent in a few
  hundred steps, so the bound does not select a symmetry in a short run.

Where the guides start (``start``, :func:`make_init_loc_fn`, used by :meth:`LayerwiseNet.guide_defaults`). An
8-block network without BatchNorm does not train from a guide centred at zero (a MAP point at 0
has zero gradients; a mean-field guide at the prior's scale samples pure noise) nor with N(0, 1)
block biases (dead ReLUs). ``start="equivariant"`` (default) starts at the He-scaled equivariant
restriction: non-equivariant pathway weights at 0, equivariant ones at a prior draw ×√(K/K_eq),
biases at 0. ``start="prior"`` starts every weight at a prior draw; then the unneeded FC weights
keep their random values for the whole run (MAP weight decay δθ/N is weak), ‖θ*‖² stays ≈ P and
the Laplace update *lowers* δ_FC (measured: δ_FC 0.08–1.7 after 300 steps, 74.7% on the digit
task). Density guides start with scale 0.01. Use ``fit(..., lr=1e-2, eta_lr=1e-3)``
(:data:`FIT_DEFAULTS`; the CLI applies them through ``fit_defaults``). Narrow networks can die in
the first steps at that rate: at ``alpha=1`` (F-FC + CONV + GCONV, 16-px Fashion-MNIST) 7 of 18 MAP
fits of seeds 0–5 ended at the constant prediction — starts with almost no signal, or lively and
confidently wrong ones whose image dependence Adam removes within four steps
(``research/layerwise_init/REPORT.md``). Check that the training NLL leaves ln C, or lower ``lr``:
at ``lr=3e-3`` for 600 steps none of the 18 Table 3 fits of seeds 0–2 died
(``benchmarks/results/layerwise_table3_ffc_lr0.003_steps600.md``).

Why ``prior="learned"`` by default: it is the paper's type-II maximum likelihood (a point estimate
of δ maximising the bound) and lets δ run to the equivariant limit δ → ∞ without a hyperprior
penalty; ``"hierarchical"`` adds a LogNormal hyperprior and a mean-field posterior over log δ
(a full Bayesian treatment, but a hyperprior that penalises the very limit that selects a symmetry).
Learned δ are the model's :meth:`~LayerwiseNet.symmetry_parameters`, so :func:`pyro_invariance.fit`
trains them with ``eta_lr``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry import equivariant_layers as L
from pyro_invariance.tasks import CLASSIFICATION
from pyro_invariance.validation import check_label_shape, check_positive_int, check_seed, check_trailing_shape

from .base import CatalogueModel, PrecisionGroup

__all__ = [
    "CHANNEL_MULTIPLIERS",
    "FIT_DEFAULTS",
    "init_weights_from_prior",
    "make_init_loc_fn",
    "STARTS",
    "PAPER_STRIDES",
    "VARIANTS",
    "Architecture",
    "LayerwiseNet",
    "Pathway",
    "architecture",
    "count_parameters",
    "parse_variant",
    "resolve_strides",
]

#: Block widths in units of α (paper 004 App. F, after Neyshabur 2020).
CHANNEL_MULTIPLIERS: tuple[int, ...] = (1, 2, 2, 4, 4, 8, 8, 16)
#: The paper's strides (32×32 inputs → 1×1 before the head).
PAPER_STRIDES: tuple[int, ...] = (1, 2, 1, 2, 1, 2, 2, 2)
#: Hidden width of the head in units of α.
HEAD_MULTIPLIER = 64
#: Variant tokens -> pathway kinds of :mod:`pyro_invariance.symmetry.equivariant_layers`.
TOKENS: dict[str, str] = {"fc": "fc", "conv": "conv", "f-fc": "ffc", "s-fc": "sfc", "s-conv": "sconv", "gconv": "gconv"}
#: Registered variants (``layerwise-<variant>``).
VARIANTS: tuple[str, ...] = ("fc", "conv", "fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv")
#: ``pyro_invariance.fit`` settings that train these networks (see the module docstring).
FIT_DEFAULTS: dict[str, float] = {"lr": 1e-2, "eta_lr": 1e-3}
#: Initial guide scale for the density guides (a small spread around a prior draw).
GUIDE_INIT_SCALE = 0.01
#: Largest dense FC weight (elements) built without ``allow_large=True``.
MAX_FC_ELEMENTS = 50_000_000


@dataclass
class Pathway:
    """One pathway of a :class:`LayerwiseNet`, for analysis.

    Attributes:
        block: 0..7 for the relaxed blocks, 8 and 9 for the two head layers.
        kind: ``"fc"``, ``"conv"``, ``"ffc"``, ``"sconv"``, ``"sfc"``, ``"gconv"`` or ``"head"``.
        sites: the weight sample sites (F-FC / S-FC: ``weight_out`` = θ₁ then ``weight_in`` = θ₂),
            aligned with :meth:`LayerwiseNet.prior_precision`.
        num_params: number of elements of ``sites``.
        bias_sites: bias sites that share the precision of ``sites[0]`` (the FC pathway's
            position-dependent bias, the head biases); not counted in ``num_params``.
    """

    block: int
    kind: str
    sites: list[str]
    num_params: int
    bias_sites: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Architecture:
    """Block specs and head sizes of a variant (shared by :class:`LayerwiseNet` and
    :func:`count_parameters`)."""

    kinds: tuple[str, ...]
    blocks: tuple[L.BlockSpec, ...]
    options: L.LayerOptions
    head_in: int
    head_hidden: int
    num_classes: int

    @property
    def group(self) -> bool:
        return "gconv" in self.kinds


def parse_variant(variant: str) -> tuple[str, ...]:
    """Pathway kinds of a variant name, e.g. ``"f-fc+conv"`` → ``("ffc", "conv")``."""
    if not isinstance(variant, str) or not variant.strip():
        raise ValueError(f"variant must be a non-empty string like 'fc+conv', got {variant!r}")
    tokens = [t.strip().lower() for t in variant.split("+")]
    unknown = [t for t in tokens if t not in TOKENS]
    if unknown:
        raise ValueError(
            f"unknown pathway(s) {unknown} in variant {variant!r}; combine {sorted(TOKENS)} with '+' "
            f"(registered: {', '.join(VARIANTS)})"
        )
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"variant {variant!r} repeats a pathway")
    return tuple(TOKENS[t] for t in tokens)


def resolve_strides(strides: str | Sequence[int], height: int, width: int) -> tuple[int, ...]:
    """The 8 block strides for an ``height × width`` input (see the module docstring)."""
    if isinstance(strides, str):
        if strides != "auto":
            raise ValueError(f"strides must be 'auto' or 8 integers in {{1, 2}}, got {strides!r}")
        out = list(PAPER_STRIDES)
        twos = [i for i, s in enumerate(out) if s == 2]
        while twos and (height % 2 ** len(twos) or width % 2 ** len(twos)):
            out[twos.pop()] = 1
        return tuple(out)
    out_t = tuple(strides)
    if len(out_t) != len(CHANNEL_MULTIPLIERS) or any(isinstance(s, bool) or s not in (1, 2) for s in out_t):
        raise ValueError(f"strides must be 'auto' or {len(CHANNEL_MULTIPLIERS)} integers in {{1, 2}}, got {strides!r}")
    total = math.prod(out_t)
    if height % total or width % total:
        raise ValueError(
            f"input size {height}×{width} is not divisible by the total stride {total} of strides {out_t}; "
            "use strides='auto' or an input size divisible by it"
        )
    return out_t


def _image_shape(image_shape: Sequence[int]) -> tuple[int, int, int]:
    try:
        shape = tuple(int(v) for v in image_shape)
    except (TypeError, ValueError):
        raise ValueError(f"image_shape must be (C, H, W) with positive integers, got {image_shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"image_shape must be (C, H, W) with positive integers, got {image_shape!r}")
    return shape  # type: ignore[return-value]


def architecture(
    variant: str,
    alpha: int,
    image_shape: Sequence[int],
    num_classes: int,
    *,
    strides: str | Sequence[int] = "auto",
    sconv_anchors: int | None = None,
    sfc_anchor_fraction: float = 0.5,
    rbf_lengthscale: float = 1.0,
    rbf_variance: float = 1.0,
    rbf_noise: float = 0.01,
    init_seed: int = 0,
) -> Architecture:
    """Sizes of every block and of the head (no tensors are built).

    ``sconv_anchors=None`` uses the paper's choice: 4 anchors when the variant also has S-FC,
    else 7 (of 9). ``init_seed`` seeds the sparse layers' random anchor subsets
    (``LayerOptions.anchor_seed``).
    """
    kinds = parse_variant(variant)
    check_positive_int("alpha", alpha)
    check_positive_int("num_classes", num_classes, minimum=2)
    c, h, w = _image_shape(image_shape)
    stride_list = resolve_strides(strides, h, w)
    group = "gconv" in kinds
    if group and h != w:
        raise ValueError(f"GCONV variants rotate by 90° and need square images, got {h}×{w}")
    if sconv_anchors is None:
        sconv_anchors = 4 if "sfc" in kinds else 7
    options = L.LayerOptions(
        sconv_anchors=sconv_anchors,
        sfc_anchor_fraction=sfc_anchor_fraction,
        rbf_lengthscale=rbf_lengthscale,
        rbf_variance=rbf_variance,
        rbf_noise=rbf_noise,
        anchor_seed=init_seed,
    )
    g_out = L.P4 if group else 1
    blocks, c_in, g_in = [], c, 1
    for i, (mult, stride) in enumerate(zip(CHANNEL_MULTIPLIERS, stride_list)):
        spec = L.BlockSpec(i, c_in, g_in, h, w, alpha * mult, g_out, stride)
        blocks.append(spec)
        c_in, g_in, h, w = spec.c_out, spec.g_out, spec.h_out, spec.w_out
    return Architecture(
        kinds=kinds,
        blocks=tuple(blocks),
        options=options,
        head_in=c_in * h * w,
        head_hidden=HEAD_MULTIPLIER * alpha,
        num_classes=int(num_classes),
    )


def _site_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every weight/bias sample site of the network and its shape, in forward order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in arch.blocks:
        for kind in arch.kinds:
            for name, shape in L.PATHWAYS[kind].site_shapes(spec, arch.options).items():
                shapes[f"blocks.{spec.index}.{kind}.{name}"] = shape
        shapes[f"blocks.{spec.index}.bias"] = (spec.c_out,)
    sizes = ((arch.head_in, arch.head_hidden), (arch.head_hidden, arch.num_classes))
    for j, (n_in, n_out) in enumerate(sizes):
        for name, shape in L.BayesianLinear.site_shapes(n_in, n_out).items():
            shapes[f"head.{j}.{name}"] = shape
    return shapes


def count_parameters(
    variant: str,
    alpha: int = 10,
    image_shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    **kwargs: Any,
) -> int:
    """Number of weights and biases of a ``layerwise`` network, computed from the layer specs
    without building it (``kwargs`` as for :func:`architecture`). Precisions δ are not counted.

    >>> round(count_parameters("f-fc+conv", 10, (3, 32, 32), 10) / 1e6, 2)   # paper: 1.8M
    1.77
    """
    arch = architecture(variant, alpha, image_shape, num_classes, **kwargs)
    return sum(math.prod(s) for s in _site_shapes(arch).values())


def init_weights_from_prior(site: dict) -> Tensor:
    """Pyro ``init_loc_fn``: a prior draw for weight sites (He-scaled, as the weights are
    standardised), 0 for bias sites (``*.bias``) and ``init_to_feasible`` (the guides' default:
    δ = 1 for the hierarchical precisions) for anything else."""
    name = site["name"]
    if name.endswith("bias") or name.endswith("bias_out") or name.endswith("bias_in"):
        return torch.zeros_like(site["fn"].sample())
    if ".weight" in name:
        return site["fn"].sample().detach()
    from pyro.infer.autoguide.initialization import init_to_feasible

    return init_to_feasible(site)


#: Where the guides start: ``"equivariant"`` (non-equivariant pathways at 0) or ``"prior"`` (a prior draw).
STARTS: tuple[str, ...] = ("equivariant", "prior")


def make_init_loc_fn(arch: Architecture, start: str = "equivariant") -> Any:
    """Pyro ``init_loc_fn`` for a network built from ``arch``.

    ``"prior"``: :func:`init_weights_from_prior` (every weight a prior draw, biases 0).
    ``"equivariant"`` (default): the network starts as its equivariant restriction — weights of
    the non-equivariant pathways at 0 (for F-FC and S-FC: the output factor ``weight_out`` at 0 and
    ``weight_in`` a prior draw, so that the product has a gradient), those of the equivariant
    pathways a prior draw scaled by ``√(K / K_eq)`` (K pathways per block, K_eq equivariant), so the
    block's ``1/√K`` normalisation leaves a He-scaled equivariant network. Variants without an
    equivariant pathway (``fc``) start from the prior. MAP and the Laplace evidence need this: from
    a prior draw the unneeded FC weights stay at their random values for the whole run (weight decay
    δθ/N is tiny), so ‖θ*‖² stays ≈ P/δ and MacKay's update *lowers* δ.
    """
    if start not in STARTS:
        raise ValueError(f"unknown start {start!r}; use one of {STARTS}")
    equivariant = [k for k in arch.kinds if L.PATHWAYS[k].equivariant]
    if start == "prior" or not equivariant:
        return init_weights_from_prior
    boost = math.sqrt(len(arch.kinds) / len(equivariant))

    def init_loc(site: dict) -> Tensor:
        value = init_weights_from_prior(site)
        parts = site["name"].split(".")
        if len(parts) == 4 and parts[0] == "blocks" and parts[2] in L.PATHWAYS:
            if L.PATHWAYS[parts[2]].equivariant:
                return value * boost if parts[3].startswith("weight") else value
            if parts[3] != "weight_in":
                return torch.zeros_like(value)
        return value

    return init_loc


class LayerwiseNet(CatalogueModel):
    """ELLA's 8-block network with relaxed-equivariance layers (see the module docstring).

    Args:
        variant: pathways joined by ``+`` (``"fc"``, ``"conv"``, ``"fc+conv"``, ``"f-fc+conv"``,
            ``"s-fc+s-conv"``, ``"fc+conv+gconv"``, ...).
        image_shape: ``(C, H, W)`` of the inputs.
        num_classes: number of classes.
        alpha: width α (the paper: 10; 2 for GCONV variants).
        prior: ``"learned"`` (default), ``"hierarchical"`` or ``"fixed"`` precisions δ.
        prior_scale: initial (or fixed) prior standard deviation of θ, δ₀ = prior_scale⁻²; the
            hierarchical prior's median of δ is δ₀.
        hyperprior_scale: scale of ``log δ ~ N(log δ₀, scale²)`` (hierarchical).
        strides: ``"auto"`` or 8 strides in {1, 2} whose product divides H and W.
        sconv_anchors, sfc_anchor_fraction, rbf_lengthscale, rbf_variance, rbf_noise:
            sparse-layer settings (:class:`~pyro_invariance.symmetry.equivariant_layers.LayerOptions`).
        init_seed: seed of the sparse layers' random anchor subsets (``LayerOptions.anchor_seed``).
        allow_large: build dense FC weights above 50M elements (otherwise a ValueError suggests F-FC).
        start: where the guides start, ``"equivariant"`` (default) or ``"prior"``
            (:func:`make_init_loc_fn`; used by :meth:`guide_defaults`).

    Shapes: ``forward(x (B, C, H, W), y (B,))`` → logits ``(B, num_classes)``.

    Raises:
        ValueError: bad sizes, α ≤ 0, unknown pathway, strides that do not divide the input,
            an over-large dense FC; in ``forward``, inputs of the wrong shape or dtype (no value
            is read there: :meth:`prepare_inputs`, which ``fit`` / ``evaluate`` call once on the
            whole data set, checks non-finite inputs and labels outside ``[0, num_classes)``).
    """

    def __init__(
        self,
        variant: str = "fc+conv",
        image_shape: Sequence[int] = (1, 16, 16),
        num_classes: int = 10,
        alpha: int = 2,
        prior: str = "learned",
        prior_scale: float = 1.0,
        hyperprior_scale: float = 3.0,
        strides: str | Sequence[int] = "auto",
        sconv_anchors: int | None = None,
        sfc_anchor_fraction: float = 0.5,
        rbf_lengthscale: float = 1.0,
        rbf_variance: float = 1.0,
        rbf_noise: float = 0.01,
        init_seed: int = 0,
        allow_large: bool = False,
        start: str = "equivariant",
    ) -> None:
        super().__init__()
        if start not in STARTS:
            raise ValueError(f"unknown start {start!r}; use one of {STARTS}")
        self.check_prior(prior)
        check_seed(init_seed, "init_seed")
        for name, value in (("prior_scale", prior_scale), ("hyperprior_scale", hyperprior_scale)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        arch = architecture(
            variant,
            alpha,
            image_shape,
            num_classes,
            strides=strides,
            sconv_anchors=sconv_anchors,
            sfc_anchor_fraction=sfc_anchor_fraction,
            rbf_lengthscale=rbf_lengthscale,
            rbf_variance=rbf_variance,
            rbf_noise=rbf_noise,
            init_seed=init_seed,
        )
        if "fc" in arch.kinds and not allow_large:
            for spec in arch.blocks:
                n = spec.in_size * spec.out_size
                if n > MAX_FC_ELEMENTS:
                    raise ValueError(
                        f"the dense FC weight of block {spec.index} would have {n:,} elements "
                        f"({spec.out_size} × {spec.in_size}); use a factored variant ('f-fc' instead of 'fc'), "
                        "a smaller alpha or input, or allow_large=True"
                    )
        self.variant = "+".join(t.strip().lower() for t in variant.split("+"))
        self.arch = arch
        self.start = start
        self.image_shape = _image_shape(image_shape)
        self.num_classes = arch.num_classes
        self.alpha = int(alpha)
        self.prior = prior
        self.strides = tuple(spec.stride for spec in arch.blocks)
        precision_init = 1.0 / float(prior_scale) ** 2  # δ₀ = prior_scale⁻²
        kw = dict(prior=prior, precision_init=precision_init, hyperprior_scale=float(hyperprior_scale))
        self.blocks = PyroModule[nn.ModuleList](
            [L.RelaxedBlock(spec, arch.kinds, arch.options, **kw) for spec in arch.blocks]  # type: ignore[arg-type]
        )
        self.head = PyroModule[nn.ModuleList](
            [
                L.BayesianLinear(arch.head_in, arch.head_hidden, gain=2.0, **kw),  # type: ignore[arg-type]
                L.BayesianLinear(arch.head_hidden, arch.num_classes, gain=1.0, **kw),  # type: ignore[arg-type]
            ]
        )

    task = CLASSIFICATION
    priors = ("fixed", "learned", "hierarchical")
    #: Learning rates the CLI uses unless given (:data:`FIT_DEFAULTS`).
    fit_defaults = FIT_DEFAULTS
    #: Not supported: ELBO particles run one after another. Every pathway of
    #: :mod:`pyro_invariance.symmetry.equivariant_layers` (FC, circular CONV, F-FC, S-FC / S-CONV,
    #: p4 GCONV, the polyphase stride selection, the head) applies one weight draw with
    #: ``F.conv2d`` / ``F.linear``; per-particle weights (``(P, 1, out, in)``) would need each kind
    #: rewritten as a grouped convolution with the particles folded into channels, and P copies of
    #: an 8-block network's activations. The paper's objective here is the Laplace evidence
    #: (:func:`~pyro_invariance.infer.laplace.fit_laplace`), which has no particles.
    vectorizable_particles = False

    # ------------------------------------------------------------------------------------------
    # analysis interface

    def pathways(self) -> list[Pathway]:
        """Every pathway of every block (0..7) and the two head layers (8, 9, kind ``"head"``)."""
        out = []
        for spec in self.arch.blocks:
            for kind in self.arch.kinds:
                cls = L.PATHWAYS[kind]
                shapes = cls.site_shapes(spec, self.arch.options)
                prefix = f"blocks.{spec.index}.{kind}"
                out.append(
                    Pathway(
                        block=spec.index,
                        kind=kind,
                        sites=[f"{prefix}.{n}" for n in cls.weights],
                        num_params=sum(math.prod(shapes[n]) for n in cls.weights),
                        bias_sites=[f"{prefix}.{n}" for n in cls.biases],
                    )
                )
        for j, layer in enumerate(self.head):
            n = layer.in_features * layer.out_features
            out.append(Pathway(len(self.arch.blocks) + j, "head", [f"head.{j}.weight"], n, [f"head.{j}.bias"]))
        return out

    def _precision_module(self, block: int, kind: str) -> tuple[PyroModule, str, tuple[str, ...]]:
        nblocks = len(self.arch.blocks)
        if kind == "head":
            if block not in (nblocks, nblocks + 1):
                raise ValueError(f"head layers are blocks {nblocks} and {nblocks + 1}, got {block}")
            return self.head[block - nblocks], f"head.{block - nblocks}", ("precision",)
        if kind not in self.arch.kinds:
            raise ValueError(
                f"this {self.variant!r} network has pathways {list(self.arch.kinds)} and 'head', not {kind!r}"
            )
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < nblocks:
            raise ValueError(f"block must be an integer in [0, {nblocks}) for kind {kind!r}, got {block!r}")
        module = self.blocks[block].pathway(kind)
        return module, f"blocks.{block}.{kind}", tuple(type(module).weights.values())

    def prior_precision(self, block: int, kind: str, guide: Any = None) -> Tensor:
        """Current δ of a pathway: one value per entry of its ``sites``, shape ``(n,)``.

        For ``prior="hierarchical"`` δ is a latent site: pass the fitted ``guide`` to get its
        posterior median.
        """
        module, prefix, names = self._precision_module(block, kind)
        if self.prior == "hierarchical":
            if guide is None:
                raise ValueError("with prior='hierarchical' the precisions are latent: pass the fitted guide")
            median = guide.median()
            return torch.stack([median[f"{prefix}.{n}"].detach().reshape(()) for n in names])
        return torch.stack([getattr(module, n).detach().reshape(()) for n in names])

    def precision_groups(self) -> list[Any]:
        """Every prior precision δ with the sample sites it scales, as
        :class:`~pyro_invariance.models.base.PrecisionGroup` s: each pathway tensor (with the FC bias
        it shares), each block bias, each head layer. For the Laplace evidence and closed-form
        updates (``prior="fixed"``: δ are buffers that those updates set)."""
        out = []
        for spec in self.arch.blocks:
            block = self.blocks[spec.index]
            for kind in self.arch.kinds:
                module = block.pathway(kind)
                sites: dict[str, list[str]] = {}
                for site, precision in {**type(module).weights, **type(module).biases}.items():
                    sites.setdefault(precision, []).append(f"blocks.{spec.index}.{kind}.{site}")
                for precision, names in sites.items():
                    out.append(PrecisionGroup(f"blocks.{spec.index}.{kind}.{precision}", module, precision, names))
            out.append(
                PrecisionGroup(
                    f"blocks.{spec.index}.bias_precision", block, "bias_precision", [f"blocks.{spec.index}.bias"]
                )
            )
        for j, layer in enumerate(self.head):
            out.append(
                PrecisionGroup(f"head.{j}.precision", layer, "precision", [f"head.{j}.weight", f"head.{j}.bias"])
            )
        return out

    def guide_defaults(self, guide_name: str) -> dict[str, Any]:
        """Keyword arguments :func:`pyro_invariance.guides.get` adds for this model (explicit
        arguments win): the start of :func:`make_init_loc_fn` (``self.start``); density guides at
        scale 0.01; the matrix-normal guide keeps Kronecker factors above 512 diagonal."""
        out: dict[str, Any] = {"init_loc_fn": make_init_loc_fn(self.arch, self.start)}
        if guide_name != "map":
            out["init_scale"] = GUIDE_INIT_SCALE
        if guide_name == "matrix-normal":
            out["diagonal_factors"] = 512
        return out

    def symmetry_parameters(self) -> list[nn.Parameter]:
        """The learned precisions δ (``prior="learned"``: every pathway, block-bias and head precision, as
        the unconstrained parameters of their ``PyroParam`` s), which ``fit`` trains with ``eta_lr``;
        empty for fixed (buffers) and hierarchical (latent) precisions."""
        return [
            p
            for name, p in self.named_parameters()
            if name.rsplit(".", 1)[-1].removesuffix("_unconstrained") in L.PRECISION_NAMES
        ]

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """δ of every block pathway tensor (``"delta.<block>.<kind>[.out|.in]"``) for point-estimate
        or fixed priors (empty for the hierarchical prior, whose δ are latent)."""
        if self.prior == "hierarchical":
            return {}
        out: dict[str, Tensor] = {}
        for spec in self.arch.blocks:
            for kind in self.arch.kinds:
                module = self.blocks[spec.index].pathway(kind)
                names = list(type(module).weights.values())
                for n in names:
                    suffix = "" if len(names) == 1 else "." + n.removeprefix("precision_")
                    out[f"delta.{spec.index}.{kind}{suffix}"] = getattr(module, n).detach()
        return out

    def site_shapes(self) -> dict[str, tuple[int, ...]]:
        """Weight and bias sample sites and their shapes (precision sites excluded)."""
        return _site_shapes(self.arch)

    def num_parameters(self) -> int:
        """Elements of all weight and bias sites (= :func:`count_parameters`)."""
        return sum(math.prod(s) for s in self.site_shapes().values())

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims
        (:func:`pyro_invariance.diagnostics.inference_data.to_inference_data`)."""
        dims: dict[str, list[str]] = {}
        for name, shape in self.site_shapes().items():
            dims[name] = [f"{name}.out", f"{name}.in"] if len(shape) == 2 else [f"{name}.out"]
        if self.prior == "hierarchical":
            for p in self.pathways():
                module, prefix, names = self._precision_module(p.block, p.kind)
                for n in names:
                    dims[f"{prefix}.{n}"] = []
            for spec in self.arch.blocks:
                dims[f"blocks.{spec.index}.bias_precision"] = []
        dims["obs"] = ["obs_dim_0"]
        return dims

    # ------------------------------------------------------------------------------------------

    def input_shapes(self) -> list[tuple[int, ...]]:
        """``x`` rows are images ``(C, H, W)``."""
        return [self.image_shape]

    def _check_input(self, x: Tensor) -> Tensor:
        check_trailing_shape("x", x, self.input_shapes())
        if not x.is_floating_point():
            raise ValueError(f"x must be floating point, got {x.dtype}")
        return x

    def features(self, x: Tensor) -> Tensor:
        """Flattened features entering the head, ``(B, 16α·H₈·W₈)``."""
        h = self._check_input(x).unsqueeze(2)  # (B, C, 1, H, W)
        for block in self.blocks:
            h = block(h)
        h = h.amax(dim=2) if self.arch.group else h.squeeze(2)  # GCONV: max over rotations
        return h.flatten(1)

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Pyro model: logits ``(B, C)``; observes ``y`` in plate "data" scaled to ``num_data``."""
        if y is not None:
            check_label_shape(y, x.shape[0])
        z = self.features(x)
        logits = self.head[1](F.relu(self.head[0](z)))
        self.observe(dist.Categorical(logits=logits), y, x, num_data)
        return logits


# ------------------------------------------------------------------------------------------------
# catalogue entries

_SUMMARIES = {
    "fc": "ELLA net, dense FC layers only (paper 004 Eq. 1; no equivariance; small inputs only)",
    "conv": "ELLA net, 3×3 circular convolutions (strictly translation-equivariant; Eq. 3)",
    "fc+conv": "ELLA net, FC + CONV residual pathways with learned precisions (Eq. 4)",
    "f-fc+conv": "ELLA net, factored FC + CONV pathways with learned precisions (Eq. 5; paper's model)",
    "s-fc+s-conv": "ELLA net, sparse (RBF-anchor) FC + CONV pathways with learned precisions (Eqs. 6-7)",
    "fc+conv+gconv": "ELLA net choosing among FC / CONV / p4 GCONV pathways (App. B)",
}


def _make_factory(variant: str) -> Any:
    def factory(
        image_shape: Sequence[int] = (1, 16, 16),
        num_classes: int = 10,
        alpha: int = 2,
        prior: str = "learned",
        **kwargs: Any,
    ) -> LayerwiseNet:
        model = LayerwiseNet(
            variant, image_shape=image_shape, num_classes=num_classes, alpha=alpha, prior=prior, **kwargs
        )
        model.catalogue_name = f"layerwise-{variant}"  # the registry entry (one class, several entries)
        return model

    factory.__name__ = factory.__qualname__ = "layerwise_" + variant.replace("+", "_").replace("-", "")
    factory.__signature__ = _factory_signature(factory)  # type: ignore[attr-defined]
    factory.__doc__ = (
        f"{_SUMMARIES[variant]}.\n\n"
        f"Builds ``LayerwiseNet({variant!r}, ...)``; see :class:`LayerwiseNet` for the arguments."
    )
    return factory


def _factory_signature(factory: Any) -> inspect.Signature:
    """The factory's own parameters followed by :class:`LayerwiseNet`'s other keywords, without
    ``**kwargs``: what the factory really takes, so that the registry can name a misspelt argument
    and list the valid ones."""
    own = [p for p in inspect.signature(factory).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in own}
    net = list(inspect.signature(LayerwiseNet.__init__).parameters.values())[2:]  # after self, variant
    extra = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in net if p.name not in names]
    return inspect.signature(factory).replace(parameters=[*own, *extra])


for _variant in VARIANTS:
    MODELS.register(f"layerwise-{_variant}", summary=_SUMMARIES[_variant])(_make_factory(_variant))
