"""Bayesian linear regression on symmetrised basis functions: the catalogue's reference entry.

The toy from the talk *Bayesian Neural Model Selection for Symmetry Learning* (van der Ouderaa,
2025; ``papers/000``, slides "Inductive bias in basis functions" and "Can we learn the inductive
bias?"). It is the smallest model in which a symmetry is learnt by maximising the marginal
likelihood, and the only one in the catalogue whose evidence is known in closed form, so every
guide and objective can be checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam, PyroSample
from torch import Tensor, nn

from pyro_invariance.data.basis_toy import make_symmetric_toy  # noqa: F401  (re-exported: the toy's data)
from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry.priors import BOUNDED_PRIORS, bounded_prior
from pyro_invariance.tasks import REGRESSION
from pyro_invariance.validation import check_positive_float, check_positive_int, check_seed
from pyro_invariance.weight_priors import normal_prior

from .base import CatalogueModel

__all__ = ["BasisRegression", "make_symmetric_toy", "BASES"]

#: Basis names understood by :class:`BasisRegression`.
BASES: tuple[str, ...] = ("rbf", "rff", "poly")

_LOG_2PI = math.log(2.0 * math.pi)


@MODELS.register(
    "basis-regression",
    summary="Bayesian linear regression on basis functions with a learnable reflection symmetry "
    "φ^λ(x) = (1−λ/2)φ(x) + (λ/2)φ(−x); closed-form evidence (talk 000)",
)
class BasisRegression(CatalogueModel):
    r"""Bayesian linear regression on symmetrised basis functions (talk 000, "Inductive bias in
    basis functions").

    Generative story, for inputs ``x_n ∈ R^{D_in}`` and outputs ``y_n ∈ R^{D_out}``::

        φ^λ(x) = (1 − λ/2) φ(x) + (λ/2) φ(−x)          symmetrised features, (F,)
        W      ~ N(0, s_p² I),   W ∈ R^{D_out × F}      site "weight" (rows = outputs)
        y_n    ~ N(W φ^λ(x_n), σ² I_{D_out})           site "obs", inside plate "data"

    with prior scale ``s_p = prior_scale``, a fixed, known noise scale ``σ = noise_scale`` and the
    symmetry parameter ``λ ∈ [0, 2]`` (the model's η: a ``PyroParam`` when ``learn_symmetry``, else a
    buffer; with ``symmetry_prior`` a latent site ``"lam"`` with ``λ ~ U(0, 2)`` or a scaled
    logit-normal, whose exact posterior is ``p(λ | D) ∝ p(D | λ) p(λ)``, a 1-D quadrature of
    :meth:`log_evidence`: :func:`pyro_invariance.diagnostics.symmetry_posterior.exact_symmetry_posterior`). The
    slide writes ``f(x) = wᵀφ(x)`` and the symmetric basis ``φ^sym(x) = |G|⁻¹ Σ_g φ(g·x)`` for the
    reflection group ``G = {x, −x}``; ``φ^λ`` interpolates between no symmetry (λ = 0), the fully
    symmetrised, even basis (λ = 1, every ``f`` satisfies ``f(x) = f(−x)``) and the mirrored basis
    (λ = 2). The talk's point ("Can we learn the inductive bias? ... Unfortunately, NOT" with the
    training loss) is that λ is chosen by the marginal likelihood ``p(y | x, λ)``, not by the fit.

    What λ does to the prior. When the basis is closed under reflection (``φ(−x) = Pφ(x)`` for an
    orthogonal ``P``: the ``"poly"`` and ``"rff"`` bases always, the ``"rbf"`` basis when its
    centres are symmetric about 0, e.g. the default grid on ``[−hi, hi]``), the prior covariance of
    ``f`` is::

        k_λ(x, x') = k_even(x, x') + (1 − λ)² k_odd(x, x'),

    where ``k_even`` / ``k_odd`` are the even / odd parts of ``k = s_p² φ(x)ᵀφ(x')``. So λ scales
    the prior variance of the odd part of ``f``: even data are best explained at λ = 1, data with a
    strong odd part near λ ∈ {0, 2}, and the evidence is symmetric, ``p(y | λ) = p(y | 2 − λ)``.
    In particular λ = 1 is a stationary point of the evidence: do not initialise a learnt λ there.

    Bases (``features(x)`` returns ``φ^λ(x)``, shape ``(B, F)``):

    * ``"rbf"``: ``φ_m(x) = exp(−‖x − c_m‖² / (2ℓ²))``. The centres are ``centres`` if given, else
      a grid on ``[lo, hi]^{D_in}`` (``F`` points for ``D_in = 1``; for ``D_in > 1``, ``F`` must
      be ``m^{D_in}``: ``m`` points per axis).
    * ``"rff"``: random Fourier features ``sqrt(2/F) [cos(Ωx), sin(Ωx)]`` with ``F/2`` frequencies
      ``Ω ~ N(0, ℓ⁻² I)`` drawn once from ``init_seed`` (``F`` even); ``s_p² φᵀφ'`` approximates an RBF
      kernel of variance ``s_p²``.
    * ``"poly"``: ``[1, z_j^k]`` for ``k = 1..degree`` and every input dimension ``j``, with
      ``z = x / max(|lo|, |hi|)`` (so that powers stay O(1)); ``F = 1 + D_in·degree``.

    Exact inference (float64 internally). The evidence is, for each output ``d`` with
    ``Φ = φ^λ(x)`` of shape ``(N, F)``::

        log p(y | x, λ) = Σ_d log N(y_{:,d} | 0, s_p² ΦΦᵀ + σ² I_N),

    computed in the F×F form with ``A = ΦᵀΦ/σ² + I/s_p²`` (Woodbury and the determinant lemma).
    With the isotropic prior and noise shared by the outputs, the posterior over ``W`` is
    matrix-normal, ``MN(M, I_{D_out}, Σ)``: rows independent, each ``N(M_d, Σ)``, with
    ``Σ = A⁻¹`` and ``M = YᵀΦΣ/σ²``. See :meth:`log_evidence`, :meth:`posterior`, :meth:`predict`.

    Pyro usage: ``model(x, y=None, num_data=None)`` samples ``"weight"`` then scores ``"obs"``
    inside ``pyro.plate("data", num_data or B, subsample=arange(B))``, so a minibatch of B rows out
    of N is scaled by exactly N/B and ``Trace_ELBO`` is an unbiased estimate of the full-data ELBO.
    It returns the mean prediction ``Φ Wᵀ``, shape ``(B, D_out)`` (with leading batch dimensions
    when ``"weight"`` is batched, e.g. vectorised particles). With the exact posterior as guide the
    ELBO equals :meth:`log_evidence`. ``forward`` checks shapes only; :meth:`prepare_inputs` (called
    once by ``fit`` / ``evaluate``) converts ``x`` and ``y`` to the model's dtype and rejects
    non-finite values; the exact-inference methods check their inputs themselves. The learnt λ is the
    module parameter ``lam`` (the package's calls run with Pyro's ``module_local_params``,
    :func:`pyro_invariance.pyro_scope`, so models never share it there; under plain Pyro it is also
    the param-store entry ``"lam"``).

    Args:
        in_features: input dimension ``D_in``.
        out_features: output dimension ``D_out``.
        basis: one of :data:`BASES`.
        num_features: ``F`` for ``"rbf"`` / ``"rff"`` (default 20); for ``"poly"`` leave it
            ``None`` (it is ``1 + D_in·degree``).
        lengthscale: ``ℓ`` of the ``"rbf"`` / ``"rff"`` bases.
        degree: polynomial degree of the ``"poly"`` basis.
        lo, hi: input range: the ``"rbf"`` grid and the ``"poly"`` normalisation.
        centres: explicit ``"rbf"`` centres, shape ``(F, D_in)`` (overrides the grid).
        symmetry: ``"reflection"``, the group ``{x, −x}`` (the only one this model takes).
        learn_symmetry: make λ a ``PyroParam`` constrained to ``[0, 2]`` (``fit`` trains it with
            ``eta_lr``); else a fixed buffer.
        eta_init: initial (or fixed) λ; in ``[0, 2]``, and in ``(0, 2)`` when learnt.
        symmetry_prior: ``None`` (λ a point estimate) or ``"uniform"`` / ``"logit-normal"`` on
            ``[0, 2]`` (:mod:`pyro_invariance.symmetry.priors`): λ is the latent site ``"lam"``
            (sampled before ``"weight"``); the exact-inference methods then need ``lam=`` explicitly.
        prior: ``"fixed"`` (the only prior this model takes: the evidence is exact for a fixed ``s_p``).
        prior_scale: ``s_p``, standard deviation of every weight.
        noise_scale: ``σ``, the known observation noise standard deviation.
        init_seed: seed of the ``"rff"`` frequencies.
    """

    task = REGRESSION
    priors = ("fixed",)
    symmetry_priors = BOUNDED_PRIORS
    #: Four ELBO particles per step: the model is tiny (full batch, D = features × outputs), so the
    #: cost is small, and with one particle the full-rank guide ended 3.96 ± 0.60 nats below the
    #: exact log evidence after 500 steps, with four 0.94 ± 0.12 (seeds 0-2, vectorised particles;
    #: ``benchmarks/results/full_rank_defaults.md``, checked by ``tests/infer/test_config.py``).
    fit_defaults = {"num_particles": 4}
    #: ``forward`` broadcasts over a batch of ``"weight"`` (and latent λ) draws: vectorised ELBO particles.
    vectorizable_particles = True
    #: the symmetry groups this model takes
    symmetries: tuple[str, ...] = ("reflection",)

    def __init__(
        self,
        in_features: int = 1,
        out_features: int = 1,
        basis: str = "rbf",
        num_features: int | None = None,
        lengthscale: float = 0.5,
        degree: int = 3,
        lo: float = -3.0,
        hi: float = 3.0,
        centres: Tensor | None = None,
        symmetry: str = "reflection",
        learn_symmetry: bool = True,
        eta_init: float = 0.5,
        prior: str = "fixed",
        prior_scale: float = 1.0,
        noise_scale: float = 0.1,
        init_seed: int = 0,
        symmetry_prior: str | None = None,
    ) -> None:
        super().__init__()
        self.symmetry_prior = self.check_symmetry_prior(symmetry_prior, learn_symmetry)
        if symmetry not in self.symmetries:
            raise ValueError(f"unknown symmetry {symmetry!r}; use one of {self.symmetries}")
        self.symmetry = symmetry
        self.prior = self.check_prior(prior)
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; known bases: {', '.join(BASES)}")
        self.basis = basis
        self.lengthscale = check_positive_float("lengthscale", lengthscale)
        self.prior_scale = check_positive_float("prior_scale", prior_scale)
        self.noise_scale = check_positive_float("noise_scale", noise_scale)
        check_seed(init_seed, "init_seed")
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"need finite lo < hi, got lo={lo}, hi={hi}")
        self.lo, self.hi = lo, hi

        self._set_up_basis(num_features, degree, centres, init_seed)
        self._set_up_symmetry(eta_init, learn_symmetry)

        # The prior's loc is a buffer so that `.to(device / dtype)` moves the prior with the model.
        self.register_buffer("_prior_loc", torch.zeros(()), persistent=False)
        # s_p stays a Python float: the closed-form posterior and evidence use it in float64
        self.weight = PyroSample(
            lambda self: normal_prior(self.prior_scale, [self.out_features, self.num_features], loc=self._prior_loc)
        )

    def _set_up_basis(self, num_features: int | None, degree: int, centres: Tensor | None, init_seed: int) -> None:
        """The basis φ(x) ∈ R^F: polynomial (F = 1 + in_features·degree), RBF on ``centres`` (or a grid of F
        centres in [lo, hi]), or random Fourier features (F/2 frequencies ω ~ N(0, I / lengthscale²), seeded)."""
        basis, lo, hi = self.basis, self.lo, self.hi
        if basis == "poly":
            self.degree = check_positive_int("degree", degree)
            f = 1 + self.in_features * self.degree
            if num_features is not None and num_features != f:
                raise ValueError(
                    f"basis 'poly' has 1 + in_features*degree = {f} features; got num_features={num_features!r} "
                    "(leave it None)"
                )
            if centres is not None:
                raise ValueError("centres only apply to basis 'rbf'")
            self.num_features = f
            self.poly_radius = max(abs(lo), abs(hi))
        elif basis == "rbf":
            if centres is not None:
                c = torch.as_tensor(centres, dtype=torch.get_default_dtype())
                if c.dim() == 1 and self.in_features == 1:
                    c = c.reshape(-1, 1)
                if c.dim() != 2 or c.shape[1] != self.in_features or c.shape[0] < 1:
                    raise ValueError(
                        f"centres must have shape (F, in_features={self.in_features}), got {tuple(c.shape)}"
                    )
                if not torch.isfinite(c).all():
                    raise ValueError("centres must be finite")
                if num_features is not None and num_features != c.shape[0]:
                    raise ValueError(f"num_features={num_features} but {c.shape[0]} centres were given")
                self.num_features = c.shape[0]
            else:
                self.num_features = check_positive_int("num_features", 20 if num_features is None else num_features)
                c = self._grid_centres(self.num_features)
            self.register_buffer("centres", c)
        else:  # rff
            f = check_positive_int("num_features", 20 if num_features is None else num_features, minimum=2)
            if f % 2:
                raise ValueError(f"basis 'rff' needs an even num_features (cos/sin pairs), got {f}")
            if centres is not None:
                raise ValueError("centres only apply to basis 'rbf'")
            self.num_features = f
            gen = torch.Generator().manual_seed(int(init_seed))
            omega = torch.randn(f // 2, self.in_features, generator=gen, dtype=torch.float64) / self.lengthscale
            self.register_buffer("frequencies", omega.to(torch.get_default_dtype()))

    def _set_up_symmetry(self, eta_init: float, learn_symmetry: bool) -> None:
        """The symmetry strength λ ∈ [0, 2]: a latent site under ``symmetry_prior``, a constrained parameter when
        learned (starting inside (0, 2)), else a buffer."""
        try:
            lam0 = float(eta_init)
        except (TypeError, ValueError):
            raise ValueError(f"eta_init must be a number in [0, 2], got {eta_init!r}") from None
        self.learn_symmetry = bool(learn_symmetry)
        if self.symmetry_prior is not None:
            self.register_buffer("lam_upper", torch.tensor(2.0))
            self.lam = PyroSample(lambda m: bounded_prior(m.symmetry_prior, m.lam_upper))
        elif self.learn_symmetry:
            if not 0.0 < lam0 < 2.0:
                raise ValueError(
                    "a learnt eta_init (λ) must start inside (0, 2) (the constraint's boundary maps to ±inf), "
                    f"got {eta_init!r}"
                )
            self.lam = PyroParam(torch.tensor(lam0), constraint=constraints.interval(0.0, 2.0))
        else:
            if not 0.0 <= lam0 <= 2.0:
                raise ValueError(f"eta_init (λ) must lie in [0, 2], got {eta_init!r}")
            self.register_buffer("lam", torch.tensor(lam0))

    def _grid_centres(self, f: int) -> Tensor:
        d = self.in_features
        if d == 1:
            axis = torch.linspace(self.lo, self.hi, f) if f > 1 else torch.tensor([(self.lo + self.hi) / 2])
            return axis.reshape(-1, 1)
        m = round(f ** (1.0 / d))
        if m**d != f:
            raise ValueError(
                f"an rbf grid in {d} dimensions needs num_features = m**{d}; got {f} (or pass centres explicitly)"
            )
        axis = torch.linspace(self.lo, self.hi, m) if m > 1 else torch.tensor([(self.lo + self.hi) / 2])
        grids = torch.meshgrid(*([axis] * d), indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=-1)

    def extra_repr(self) -> str:
        return (
            f"basis={self.basis!r}, in_features={self.in_features}, out_features={self.out_features}, "
            f"num_features={self.num_features}, prior_scale={self.prior_scale}, noise_scale={self.noise_scale}, "
            f"learn_symmetry={self.learn_symmetry}"
        )

    # ----------------------------------------------------------------------------------------------
    # inputs

    def input_shapes(self) -> list[tuple[int, ...]]:
        """``x`` rows ``(D_in,)`` (or scalars when ``D_in = 1``)."""
        return [(self.in_features,)] + ([()] if self.in_features == 1 else [])

    def target_shapes(self) -> list[tuple[int, ...]]:
        """``y`` rows ``(D_out,)`` (or scalars when ``D_out = 1``)."""
        return [(self.out_features,)] + ([()] if self.out_features == 1 else [])

    def _check_x(self, x: Any, finite: bool = True) -> Tensor:
        """``x`` as ``(B, D_in)``; ``finite=False`` (``forward``) reads no value."""
        x = torch.as_tensor(x)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        if x.dim() == 1:
            if self.in_features != 1:
                raise ValueError(f"x of shape {tuple(x.shape)} is 1-D but in_features={self.in_features}")
            x = x.reshape(-1, 1)
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x must have shape (B, {self.in_features}), got {tuple(x.shape)}")
        if x.shape[0] < 1:
            raise ValueError("x is empty")
        if finite and not torch.isfinite(x).all():
            raise ValueError("x contains NaN or inf")
        return x

    def _check_y(self, y: Any, x: Tensor, finite: bool = True) -> Tensor:
        """``y`` as ``(B, D_out)`` floats; ``finite=False`` (``forward``) reads no value."""
        y = torch.as_tensor(y)
        y = y.to(x.dtype) if not y.is_floating_point() else y
        if y.dim() == 1:
            if self.out_features != 1:
                raise ValueError(f"y of shape {tuple(y.shape)} is 1-D but out_features={self.out_features}")
            y = y.reshape(-1, 1)
        if y.dim() != 2 or y.shape[1] != self.out_features:
            raise ValueError(f"y must have shape (B, {self.out_features}), got {tuple(y.shape)}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
        if finite and not torch.isfinite(y).all():
            raise ValueError("y contains NaN or inf")
        return y

    def _lambda(self, lam: float | Tensor | None, like: Tensor) -> Tensor:
        if lam is None:
            if self.symmetry_prior is not None:
                raise ValueError(
                    f"λ is a latent variable (symmetry_prior={self.symmetry_prior!r}): pass lam= explicitly"
                )
            value = self.lam
        else:
            # Python floats become float64 so that a scan or a finite difference in λ keeps its digits.
            value = lam if isinstance(lam, Tensor) else torch.tensor(float(lam), dtype=torch.float64)
            if value.numel() != 1:
                raise ValueError(f"lam must be a scalar, got shape {tuple(value.shape)}")
            if not 0.0 <= float(value.detach()) <= 2.0:
                raise ValueError(f"lam must lie in [0, 2], got {float(value.detach())}")
            value = value.reshape(())
        return value.to(dtype=like.dtype, device=like.device)

    # ----------------------------------------------------------------------------------------------
    # features

    def _base_features(self, x: Tensor) -> Tensor:
        """φ(x), shape ``(B, F)``, for validated ``x`` of shape ``(B, D_in)``."""
        if self.basis == "rbf":
            c = self.centres.to(dtype=x.dtype, device=x.device)
            sq = (x.unsqueeze(-2) - c).pow(2).sum(-1)
            return torch.exp(-0.5 * sq / self.lengthscale**2)
        if self.basis == "rff":
            proj = x @ self.frequencies.to(dtype=x.dtype, device=x.device).T
            return math.sqrt(2.0 / self.num_features) * torch.cat([proj.cos(), proj.sin()], dim=-1)
        z = x / self.poly_radius
        powers = z.unsqueeze(-1) ** torch.arange(1, self.degree + 1, device=x.device, dtype=x.dtype)
        return torch.cat([torch.ones_like(x[:, :1]), powers.reshape(x.shape[0], -1)], dim=-1)

    def features(self, x: Tensor, lam: float | Tensor | None = None) -> Tensor:
        """Symmetrised features ``φ^λ(x) = (1 − λ/2)φ(x) + (λ/2)φ(−x)``, shape ``(B, F)``.

        ``x`` has shape ``(B, D_in)`` (or ``(B,)`` when ``D_in = 1``); the result has ``x``'s
        dtype. ``lam`` overrides the model's λ (a scalar in ``[0, 2]``; gradients flow through a
        tensor ``lam``), e.g. to scan the evidence over a grid.
        """
        return self._features(self._check_x(x), lam)

    def _features(self, x: Tensor, lam: float | Tensor | None = None) -> Tensor:
        return self._symmetrise(x, self._lambda(lam, x))

    def _symmetrise(self, x: Tensor, lam: Tensor) -> Tensor:
        """φ^λ(x) for validated ``x`` ``(B, D_in)``; a batched λ ``(...)`` (a latent λ under vectorised
        particles) gives ``(..., B, F)``."""
        lam = lam.to(x.dtype)
        if lam.dim():
            lam = lam[..., None, None]
        return (1.0 - 0.5 * lam) * self._base_features(x) + (0.5 * lam) * self._base_features(-x)

    def symmetry_parameters(self) -> list[nn.Parameter]:
        """``[λ's unconstrained parameter]`` when λ is learned as a point estimate (``[]`` when latent)."""
        return [self.lam_unconstrained] if self.learn_symmetry and self.symmetry_prior is None else []

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``{"lambda": λ}`` (detached, constrained), for logging; a latent λ from ``sites["lam"]``
        (``{}`` without)."""
        if self.symmetry_prior is not None:
            return {} if sites is None else {"lambda": sites["lam"].detach().clone()}
        return {"lambda": self.lam.detach().clone()}

    def symmetry_sites(self) -> list[str]:
        """``["lam"]`` when λ is latent."""
        return ["lam"] if self.symmetry_prior is not None else []

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims
        (:func:`pyro_invariance.diagnostics.inference_data.to_inference_data`)."""
        return {"weight": ["output", "feature"], "obs": ["obs_dim_0", "output"], "lam": []}

    # ----------------------------------------------------------------------------------------------
    # Pyro model

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Sample ``"weight"``, score ``"obs"`` in plate ``"data"``; return the mean ``ΦWᵀ``.

        Args:
            x: ``(B, D_in)`` inputs (or ``(B,)`` when ``D_in = 1``).
            y: ``(B, D_out)`` targets (or ``(B,)`` when ``D_out = 1``); ``None`` samples them.
            num_data: total number of data points N when ``x`` is a minibatch (likelihood scaled
                by N/B); ``None`` means the batch is the whole data set.

        Returns:
            the mean prediction, ``(B, D_out)``; with a batched ``"weight"`` of shape
            ``(..., 1, D_out, F)`` (vectorised particles, ``Predictive(parallel=True)``),
            ``(..., B, D_out)``.
        """
        x = self._check_x(x, finite=False)  # values: checked once by prepare_inputs (fit / evaluate)
        if y is not None:
            y = self._check_y(y, x, finite=False)
        phi = self._symmetrise(x, self.lam)  # λ first: a latent λ is sampled before "weight"
        weight = self.weight
        mean = phi @ weight.to(phi.dtype).transpose(-1, -2)  # (..., B, D_out)
        if weight.dim() > 2:
            # Batch dims of "weight" end at the data plate's dim, where the weight (outside the plate)
            # has size 1; drop it so that the rows of `mean` take that position.
            if weight.shape[-3] != 1:
                raise ValueError(
                    f"a batched weight must have shape (..., 1, {self.out_features}, {self.num_features}), "
                    f"got {tuple(weight.shape)}"
                )
            mean = mean.squeeze(-3)
        noise = torch.as_tensor(self.noise_scale, dtype=mean.dtype, device=mean.device)
        self.observe(dist.Normal(mean, noise).to_event(1), None if y is None else y.to(mean.dtype), x, num_data)
        return mean

    # ----------------------------------------------------------------------------------------------
    # exact inference

    def _exact(self, x: Tensor, y: Tensor, lam: float | Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Φ (float64), the Cholesky factor of A = ΦᵀΦ/σ² + I/s_p², and Y (float64)."""
        x = self._check_x(x)
        y = self._check_y(y, x).to(torch.float64)
        phi = self._features(x.to(torch.float64), lam=lam)
        eye = torch.eye(self.num_features, dtype=torch.float64, device=phi.device)
        a = phi.T @ phi / self.noise_scale**2 + eye / self.prior_scale**2
        return phi, torch.linalg.cholesky(a), y

    def log_evidence(self, x: Tensor, y: Tensor, lam: float | Tensor | None = None) -> Tensor:
        """Exact ``log p(y | x, λ) = Σ_d log N(y_{:,d} | 0, s_p²ΦΦᵀ + σ²I)`` (float64 scalar).

        Computed through the F×F matrix ``A = ΦᵀΦ/σ² + I/s_p² = LLᵀ``::

            log|s_p²ΦΦᵀ + σ²I| = N log σ² + F log s_p² + log|A|
            yᵀ(s_p²ΦΦᵀ + σ²I)⁻¹y = ‖y‖²/σ² − ‖L⁻¹Φᵀy‖²/σ⁴

        Differentiable in λ (the model's parameter, or a tensor ``lam`` given here). A latent λ
        (``symmetry_prior``) with ``lam=None`` gives the evidence of the whole model,
        ``log p(y | x) = log ∫ p(y | x, λ) p(λ) dλ`` (:meth:`log_marginal_evidence`).
        """
        if lam is None and self.symmetry_prior is not None:
            return self.log_marginal_evidence(x, y)
        phi, chol, y = self._exact(x, y, lam)
        n, f = phi.shape
        s2, p2 = self.noise_scale**2, self.prior_scale**2
        z = torch.linalg.solve_triangular(chol, phi.T @ y / s2, upper=False)  # (F, D_out)
        logdet = n * math.log(s2) + f * math.log(p2) + 2.0 * chol.diagonal().log().sum()
        quad = y.pow(2).sum(0) / s2 - z.pow(2).sum(0)  # (D_out,)
        return -0.5 * (y.shape[1] * (n * _LOG_2PI + logdet) + quad.sum())

    def log_evidence_batch(self, x: Tensor, y: Tensor, lams: Tensor, chunk: int = 256) -> Tensor:
        """:meth:`log_evidence` at each of the values ``lams`` ``(G,)`` in [0, 2], batched (float64 ``(G,)``):
        the same formula with Φ(λ_j) stacked, ``chunk`` values at a time."""
        x = self._check_x(x)
        y = self._check_y(y, x).to(torch.float64)
        lams = torch.as_tensor(lams, dtype=torch.float64).reshape(-1)
        if lams.numel() and not bool(((lams >= 0) & (lams <= 2)).all()):
            raise ValueError("lams must lie in [0, 2]")
        x64 = x.to(torch.float64)
        base, mirrored = self._base_features(x64), self._base_features(-x64)
        n, f = base.shape
        s2, p2 = self.noise_scale**2, self.prior_scale**2
        eye = torch.eye(f, dtype=torch.float64, device=base.device)
        out = []
        for part in lams.split(chunk):
            lam = part.to(base.device)[:, None, None]
            phi = (1.0 - 0.5 * lam) * base + (0.5 * lam) * mirrored  # (g, N, F)
            chol = torch.linalg.cholesky(phi.transpose(1, 2) @ phi / s2 + eye / p2)
            z = torch.linalg.solve_triangular(chol, phi.transpose(1, 2) @ y / s2, upper=False)  # (g, F, D)
            logdet = n * math.log(s2) + f * math.log(p2) + 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            quad = y.pow(2).sum() / s2 - z.pow(2).sum((-2, -1))
            out.append(-0.5 * (y.shape[1] * (n * _LOG_2PI + logdet) + quad))
        return torch.cat(out) if out else lams.new_zeros(0)

    def log_evidence_grid(self, x: Tensor, y: Tensor, num_points: int = 2001) -> tuple[Tensor, Tensor, Tensor]:
        """``(λ_j, log p(y | x, λ_j), log p(λ_j))`` on ``num_points`` interior points of (0, 2) (float64),
        for a latent λ (the prior is the model's ``symmetry_prior``); the inputs of a 1-D quadrature
        of ``p(λ | D) ∝ p(D | λ) p(λ)``. The grid avoids the end points, where a logit-normal
        density vanishes; ``num_points`` ≥ 3."""
        if self.symmetry_prior is None:
            raise ValueError("λ is not latent: build the model with symmetry_prior='uniform' or 'logit-normal'")
        if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 3:
            raise ValueError(f"num_points must be an integer >= 3, got {num_points!r}")
        grid = torch.linspace(0.0, 2.0, num_points + 2, dtype=torch.float64)[1:-1]
        with torch.no_grad():
            log_ev = self.log_evidence_batch(x, y, grid)
            log_prior = bounded_prior(self.symmetry_prior, torch.tensor(2.0, dtype=torch.float64)).log_prob(grid)
        return grid, log_ev, log_prior

    def log_marginal_evidence(self, x: Tensor, y: Tensor, num_points: int = 2001) -> Tensor:
        """``log p(y | x) = log ∫₀² p(y | x, λ) p(λ) dλ`` for a latent λ, by the trapezoidal rule on
        :meth:`log_evidence_grid` (float64 scalar; with 2001 points the error is far below 1e-6 nats
        for the evidences here, which are smooth in λ)."""
        grid, log_ev, log_prior = self.log_evidence_grid(x, y, num_points)
        joint = log_ev + log_prior
        weights = torch.full_like(grid, float(grid[1] - grid[0]))
        weights[0] = weights[-1] = 0.5 * weights[0]  # trapezoid on the interior grid; the two end cells
        # (width h/1 each, to 0 and 2) add h·(p(λ₁) + p(λ_G))/2 more below
        log_z = torch.logsumexp(joint + weights.log(), 0)
        edges = torch.logsumexp(torch.stack([joint[0], joint[-1]]) + math.log(float(grid[0])), 0)
        return torch.logaddexp(log_z, edges)

    def posterior(self, x: Tensor, y: Tensor, lam: float | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Exact posterior of ``"weight"``: ``(M, Σ)`` with ``M`` of shape ``(D_out, F)``, ``Σ`` ``(F, F)``.

        The posterior is matrix-normal ``MN(M, I_{D_out}, Σ)``: the rows ``W_d`` are independent,
        ``W_d ~ N(M_d, Σ)``, with ``Σ = (ΦᵀΦ/σ² + I/s_p²)⁻¹`` shared by all outputs and
        ``M = YᵀΦΣ/σ²``. As a Pyro distribution over the site:
        ``dist.MultivariateNormal(M, Σ).to_event(1)``. float64.
        """
        phi, chol, y = self._exact(x, y, lam)
        mean = torch.cholesky_solve(phi.T @ y / self.noise_scale**2, chol)  # (F, D_out)
        return mean.T.contiguous(), torch.cholesky_inverse(chol)

    def predict(
        self,
        x_new: Tensor,
        x: Tensor,
        y: Tensor,
        lam: float | Tensor | None = None,
        include_noise: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Exact posterior predictive at ``x_new``: mean ``(B*, D_out)`` and variance ``(B*,)``.

        The variance ``φ*ᵀΣφ*`` (plus ``σ²`` with ``include_noise``) is the same for every output.
        float64.
        """
        mean_w, cov = self.posterior(x, y, lam=lam)
        phi_new = self._features(self._check_x(x_new).to(torch.float64), lam=lam)
        var = ((phi_new @ cov) * phi_new).sum(-1)
        if include_noise:
            var = var + self.noise_scale**2
        return phi_new @ mean_w.T, var
