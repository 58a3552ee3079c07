"""Structured Gaussian distributions over weight matrices, with analytic KL divergences.

Two distributions used by the guides in :mod:`pyro_invariance.guides`:

* :class:`MatrixNormal` -- a random ``(r, c)`` matrix with Kronecker-structured covariance
  (the Noether's-razor guide, docs/methods.md §4)::

      W = M + L_U E L_Vᵀ,   E_ij ~ N(0, 1),
      vec_r(W) ~ N(vec_r(M), U ⊗ V),   U = L_U L_Uᵀ (r×r, among rows), V = L_V L_Vᵀ (c×c, among columns),

  where ``vec_r`` stacks the rows (row-major, ``W.reshape(-1)``): Cov(W_ij, W_kl) = U_ik V_jl.

* :class:`RowwiseMultivariateNormal` -- a random ``(C, H)`` matrix whose rows are independent
  Gaussians with their own full covariance (the block-Cholesky guide of paper 003)::

      W_c = μ_c + L_c ε_c,   ε_c ~ N(0, I_H),   c = 1..C.

Both keep the noise of their last ``rsample`` and compute ``log_prob`` of *that* sample from
the noise (no triangular solve), which is exact even when a factor is badly conditioned
(docs/methods.md §5); any other value goes through triangular solves.

Analytic KL divergences (registered with :func:`torch.distributions.kl.register_kl`, so
``torch.distributions.kl_divergence`` -- which ``pyro.distributions.kl`` re-exports and
:class:`~pyro.infer.TraceMeanField_ELBO` calls -- finds them, also for Pyro's wrappers such as
``pyro.distributions.Normal(0., s).expand([r, c]).to_event(2)``):

* ``KL(MatrixNormal ‖ Independent(Normal, 2))`` with any loc/scale broadcastable to ``(r, c)``
  (an isotropic scalar prior scale as in ``Normal(0., s).expand([r, c]).to_event(2)``, or a
  general diagonal one)::

      ½ [ Σ_ij U_ii V_jj / s_ij² + Σ_ij (M_ij − μ_ij)² / s_ij² − rc + Σ_ij log s_ij²
          − c·log|U| − r·log|V| ]

* ``KL(MatrixNormal ‖ MatrixNormal)``::

      ½ [ tr(U₁⁻¹U₀)·tr(V₁⁻¹V₀) + ‖L_U1⁻¹ (M₀ − M₁) L_V1⁻ᵀ‖²_F − rc
          + c·log(|U₁|/|U₀|) + r·log(|V₁|/|V₀|) ]

* ``KL(RowwiseMultivariateNormal ‖ Independent(Normal, 2))`` and
  ``KL(RowwiseMultivariateNormal ‖ RowwiseMultivariateNormal)`` (sums of per-row Gaussian KLs).

* :class:`DensityDelta` -- Pyro's ``Delta`` whose ``KL(DensityDelta ‖ ·)`` keeps its ``log_density``
  (below); the catalogue's guides that draw a site through an auxiliary one put it at the site.

These five registrations are global (made when this module is imported) and harmless to other
code: each concerns one of *our* distribution types as its first argument, a pair no other code
dispatches on.

Pyro 1.9's ``KL(Delta ‖ ·)`` drops ``Delta.log_density``. A guide that draws a site through an
auxiliary site and puts ``Delta(value, log_density)`` at it (Pyro's ``AutoStructured``: the
``symmetry-conditional`` guide; ``AutoMultivariateNormal``, ``AutoLowRankMultivariateNormal``,
``AutoNormal``: the log-Jacobian of a constrained site) keeps there part of log q; dropping it adds
``E_q[log_density]`` to :class:`~pyro.infer.TraceMeanField_ELBO`'s estimate (``−Σ log scale`` for
``AutoStructured``: positive once the scales are below 1), so that it is no bound. Two remedies:

* the catalogue's guides put a :class:`DensityDelta` there instead (:class:`DensityDeltaMessenger`),
  whose rule is registered at import like the other four: valid bounds under Pyro's defaults, with
  no scope;
* Pyro's own autoguides, passed to the package's calls: the correction (:func:`_kl_delta`) concerns
  Pyro's own ``Delta``, so it is *not* registered at import; :func:`corrected_delta_kl` installs it
  for the duration of a block, and the package's entry points run inside it
  (:func:`pyro_invariance.pyro_scope`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from pyro.distributions import Delta
from pyro.distributions.distribution import Distribution as PyroDistribution
from pyro.distributions.torch_distribution import ExpandedDistribution, TorchDistribution
from pyro.poutine.messenger import Messenger
from torch import Tensor
from torch.distributions import Independent, Normal, constraints
from torch.distributions import kl as _torch_kl
from torch.distributions.kl import register_kl

__all__ = [
    "DensityDelta",
    "DensityDeltaMessenger",
    "MatrixNormal",
    "RowwiseMultivariateNormal",
    "corrected_delta_kl",
]

_LOG_2PI = math.log(2 * math.pi)


# --------------------------------------------------------------------------------------------
# Helpers for a triangular factor L that is either a full lower-triangular matrix (..., n, n)
# or a positive diagonal stored as a vector (..., n).
# --------------------------------------------------------------------------------------------
def _left_mul(factor: Tensor, diag: bool, x: Tensor) -> Tensor:
    """``L @ x`` for x of shape (..., n, k)."""
    return factor.unsqueeze(-1) * x if diag else factor @ x


def _right_mul_t(x: Tensor, factor: Tensor, diag: bool) -> Tensor:
    """``x @ Lᵀ`` for x of shape (..., k, n)."""
    return x * factor.unsqueeze(-2) if diag else x @ factor.mT


def _left_solve(factor: Tensor, diag: bool, x: Tensor) -> Tensor:
    """``L⁻¹ x`` for x of shape (..., n, k)."""
    if diag:
        return x / factor.unsqueeze(-1)
    return torch.linalg.solve_triangular(factor, x, upper=False)


def _right_solve_t(x: Tensor, factor: Tensor, diag: bool) -> Tensor:
    """``x L⁻ᵀ`` for x of shape (..., k, n)."""
    if diag:
        return x / factor.unsqueeze(-2)
    return torch.linalg.solve_triangular(factor.mT, x, upper=True, left=False)


def _half_log_det(factor: Tensor, diag: bool) -> Tensor:
    """``Σ_i log L_ii = ½ log|L Lᵀ|``, shape (...)."""
    d = factor if diag else factor.diagonal(dim1=-2, dim2=-1)
    return d.log().sum(-1)


def _cov_diag(factor: Tensor, diag: bool) -> Tensor:
    """``diag(L Lᵀ)``, shape (..., n)."""
    return factor.pow(2) if diag else factor.pow(2).sum(-1)


def _dense(factor: Tensor, diag: bool) -> Tensor:
    return torch.diag_embed(factor) if diag else factor


class _WhitenedGaussian(TorchDistribution):
    """A Gaussian random matrix ``W = loc + colour(ε)``, ε standard normal of the event shape, that
    keeps the noise of its last sample: ``log_prob`` of that sample reads ε instead of solving
    ``whiten(W − loc)``. Subclasses define ``_colour``, ``_whiten`` and ``_normalizer`` (the log
    normaliser ``(rc/2) log 2π + ½ log det Σ``)."""

    support = constraints.independent(constraints.real, 2)
    has_rsample = True
    _noise_cache: tuple[Tensor, Tensor] | None

    def _expanded(self, new: _WhitenedGaussian, batch_shape: torch.Size) -> _WhitenedGaussian:
        """The end of ``expand``: ``new`` (its parameters set) as a distribution of ``batch_shape``."""
        new._noise_cache = None
        super(_WhitenedGaussian, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return self.loc.expand(self.batch_shape + self.event_shape)

    @property
    def mode(self) -> Tensor:
        return self.mean

    def rsample(self, sample_shape=torch.Size()) -> Tensor:
        """``loc + colour(ε)``, shape sample_shape + batch + event."""
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        value = self.loc + self._colour(eps)
        self._noise_cache = (value, eps)
        return value

    def log_prob(self, value: Tensor) -> Tensor:
        """``−½‖whiten(W − loc)‖²_F − normaliser`` (the class docstring's density), shape batch."""
        if self._validate_args:
            self._validate_sample(value)
        if self._noise_cache is not None and value is self._noise_cache[0]:
            z = self._noise_cache[1]  # exact noise of our own sample
        else:
            z = self._whiten(value - self.loc)
        return -0.5 * z.pow(2).sum((-2, -1)) - self._normalizer()

    def entropy(self) -> Tensor:
        """``½rc(1 + log 2π) + ½ log det Σ``, shape batch."""
        r, c = self.event_shape
        return (0.5 * r * c + self._normalizer()).expand(self.batch_shape)


class MatrixNormal(_WhitenedGaussian):
    r"""Matrix normal distribution of a random ``(r, c)`` matrix.

    .. math::

        W = M + L_U E L_V^\top,\quad E_{ij} \sim \mathcal N(0, 1),\qquad
        \operatorname{vec}_r(W) \sim \mathcal N(\operatorname{vec}_r(M),\, U \otimes V),

    with ``U = L_U L_Uᵀ`` the ``r×r`` among-row covariance and ``V = L_V L_Vᵀ`` the ``c×c``
    among-column covariance; ``vec_r`` is the row-major vectorisation ``W.reshape(-1)``, so
    ``Cov(W_ij, W_kl) = U_ik V_jl``. Density:

    .. math::

        \log p(W) = -\tfrac12 \lVert L_U^{-1}(W - M) L_V^{-\top}\rVert_F^2
                    - \tfrac{rc}{2}\log 2\pi - \tfrac c2 \log|U| - \tfrac r2 \log|V|.

    Each factor is given either as a lower-triangular matrix with positive diagonal
    (``scale_tril_row`` (..., r, r), ``scale_tril_col`` (..., c, c)) or, cheaper for wide
    layers, as a positive diagonal (``scale_row`` (..., r), ``scale_col`` (..., c)); give
    exactly one of each pair. Batch shapes of all arguments broadcast.

    **Scale ambiguity.** ``(L_U, L_V) → (a·L_U, L_V/a)`` (i.e. ``(U, V) → (a²U, V/a²)``) leaves
    the distribution unchanged for every ``a > 0``, so the two factors are identified only up to
    this one scalar. The distribution does not care; a guide that learns both factors must fix
    it. :class:`~pyro_invariance.guides.matrix_normal.MatrixNormalGuide` fixes the first
    diagonal element of the column factor, ``(L_V)₀₀ = 1`` (so ``V₀₀ = 1``; the row factor
    carries the overall scale), or -- with ``freeze_row_factor=True`` -- keeps the row factor
    fixed and learns the column factor freely.

    Args:
        loc: mean ``M``, shape (..., r, c).
        scale_tril_row: ``L_U``, lower triangular with positive diagonal, shape (..., r, r).
        scale_tril_col: ``L_V``, lower triangular with positive diagonal, shape (..., c, c).
        scale_row: diagonal ``L_U`` as a positive vector (..., r) (instead of ``scale_tril_row``).
        scale_col: diagonal ``L_V`` as a positive vector (..., c) (instead of ``scale_tril_col``).
    """

    def __init__(
        self,
        loc: Tensor,
        scale_tril_row: Tensor | None = None,
        scale_tril_col: Tensor | None = None,
        *,
        scale_row: Tensor | None = None,
        scale_col: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        if not torch.is_tensor(loc) or loc.dim() < 2:
            raise ValueError("MatrixNormal: loc must be a tensor with at least 2 dims (..., r, c)")
        r, c = loc.shape[-2:]
        row, self._row_diag = self._pick_factor("row", scale_tril_row, scale_row, r)
        col, self._col_diag = self._pick_factor("col", scale_tril_col, scale_col, c)
        fdim_row = 1 if self._row_diag else 2
        fdim_col = 1 if self._col_diag else 2
        try:
            batch_shape = torch.broadcast_shapes(
                loc.shape[:-2], row.shape[: row.dim() - fdim_row], col.shape[: col.dim() - fdim_col]
            )
        except RuntimeError as e:
            raise ValueError(f"MatrixNormal: batch shapes do not broadcast: {e}") from None
        self.loc = loc
        if self._row_diag:
            self.scale_row = row
        else:
            self.scale_tril_row = row
        if self._col_diag:
            self.scale_col = col
        else:
            self.scale_tril_col = col
        self._noise_cache: tuple[Tensor, Tensor] | None = None
        super().__init__(batch_shape, torch.Size((r, c)), validate_args=validate_args)

    @staticmethod
    def _pick_factor(which: str, tril: Tensor | None, vec: Tensor | None, n: int) -> tuple[Tensor, bool]:
        if (tril is None) == (vec is None):
            raise ValueError(f"MatrixNormal: give exactly one of scale_tril_{which} and scale_{which}")
        if tril is not None:
            if not torch.is_tensor(tril) or tril.dim() < 2 or tril.shape[-2:] != (n, n):
                raise ValueError(
                    f"MatrixNormal: scale_tril_{which} must have shape (..., {n}, {n}), "
                    f"got {tuple(getattr(tril, 'shape', ()))}"
                )
            return tril, False
        if not torch.is_tensor(vec) or vec.dim() < 1 or vec.shape[-1] != n:
            raise ValueError(
                f"MatrixNormal: scale_{which} must have shape (..., {n}), got {tuple(getattr(vec, 'shape', ()))}"
            )
        return vec, True

    @property
    def arg_constraints(self) -> dict:  # type: ignore[override]
        out = {"loc": constraints.independent(constraints.real, 2)}
        out["scale_row" if self._row_diag else "scale_tril_row"] = (
            constraints.independent(constraints.positive, 1) if self._row_diag else constraints.lower_cholesky
        )
        out["scale_col" if self._col_diag else "scale_tril_col"] = (
            constraints.independent(constraints.positive, 1) if self._col_diag else constraints.lower_cholesky
        )
        return out

    # -- factors ------------------------------------------------------------------------------
    @property
    def row_factor(self) -> Tensor:
        """``L_U`` as stored: (..., r, r), or (..., r) when diagonal."""
        return self.scale_row if self._row_diag else self.scale_tril_row

    @property
    def col_factor(self) -> Tensor:
        """``L_V`` as stored: (..., c, c), or (..., c) when diagonal."""
        return self.scale_col if self._col_diag else self.scale_tril_col

    @property
    def row_covariance(self) -> Tensor:
        """``U = L_U L_Uᵀ``, shape (..., r, r)."""
        L = _dense(self.row_factor, self._row_diag)
        return L @ L.mT

    @property
    def col_covariance(self) -> Tensor:
        """``V = L_V L_Vᵀ``, shape (..., c, c)."""
        L = _dense(self.col_factor, self._col_diag)
        return L @ L.mT

    def covariance_matrix(self) -> Tensor:
        """Dense ``U ⊗ V`` of the row-major ``vec_r(W)``, shape (..., rc, rc). For tests/small cases."""
        U, V = self.row_covariance, self.col_covariance
        r, c = self.event_shape
        K = U[..., :, None, :, None] * V[..., None, :, None, :]
        return K.reshape(K.shape[:-4] + (r * c, r * c))

    # -- distribution API ---------------------------------------------------------------------
    def expand(self, batch_shape: torch.Size | tuple[int, ...], _instance: Any = None) -> MatrixNormal:
        new = self._get_checked_instance(MatrixNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        r, c = self.event_shape
        new.loc = self.loc.expand(batch_shape + (r, c))
        new._row_diag, new._col_diag = self._row_diag, self._col_diag
        if self._row_diag:
            new.scale_row = self.scale_row.expand(batch_shape + (r,))
        else:
            new.scale_tril_row = self.scale_tril_row.expand(batch_shape + (r, r))
        if self._col_diag:
            new.scale_col = self.scale_col.expand(batch_shape + (c,))
        else:
            new.scale_tril_col = self.scale_tril_col.expand(batch_shape + (c, c))
        return self._expanded(new, batch_shape)

    @property
    def variance(self) -> Tensor:
        """Marginal variances ``diag(U)_i · diag(V)_j``, shape batch + (r, c)."""
        du = _cov_diag(self.row_factor, self._row_diag)
        dv = _cov_diag(self.col_factor, self._col_diag)
        return (du.unsqueeze(-1) * dv.unsqueeze(-2)).expand(self.batch_shape + self.event_shape)

    def _colour(self, eps: Tensor) -> Tensor:
        """``L_U E L_Vᵀ``."""
        return _right_mul_t(_left_mul(self.row_factor, self._row_diag, eps), self.col_factor, self._col_diag)

    def _whiten(self, diff: Tensor) -> Tensor:
        """``L_U⁻¹ (W − M) L_V⁻ᵀ``."""
        return _right_solve_t(_left_solve(self.row_factor, self._row_diag, diff), self.col_factor, self._col_diag)

    def _normalizer(self) -> Tensor:
        r, c = self.event_shape
        return (
            0.5 * r * c * _LOG_2PI
            + c * _half_log_det(self.row_factor, self._row_diag)
            + r * _half_log_det(self.col_factor, self._col_diag)
        )


class RowwiseMultivariateNormal(_WhitenedGaussian):
    r"""A random ``(C, H)`` matrix with independent rows, each a full-covariance Gaussian.

    .. math::

        W_c = \mu_c + L_c \varepsilon_c,\quad \varepsilon_c \sim \mathcal N(0, I_H),\qquad
        q(W) = \prod_{c=1}^{C} \mathcal N(W_c;\, \mu_c,\, L_c L_c^\top),

    i.e. a Gaussian over the row-major ``vec_r(W)`` with block-diagonal covariance, one ``H×H``
    Cholesky block per row (per output class) -- the guide over the last layer in paper 003.
    Equivalent to ``MultivariateNormal(loc, scale_tril=L).to_event(1)`` but with event shape
    ``(C, H)`` (matching a ``to_event(2)`` weight site), analytic KLs, and a ``log_prob`` of its
    own last sample computed from the noise:
    ``log q = −½‖ε‖² − (CH/2) log 2π − Σ_c Σ_h log (L_c)_hh``.

    Args:
        loc: ``μ``, shape (..., C, H).
        scale_tril: ``L``, lower triangular with positive diagonal, shape (..., C, H, H).
    """

    arg_constraints = {
        "loc": constraints.independent(constraints.real, 2),
        "scale_tril": constraints.independent(constraints.lower_cholesky, 1),
    }

    def __init__(self, loc: Tensor, scale_tril: Tensor, validate_args: bool | None = None) -> None:
        if not torch.is_tensor(loc) or loc.dim() < 2:
            raise ValueError("RowwiseMultivariateNormal: loc must have shape (..., C, H)")
        C, H = loc.shape[-2:]
        if not torch.is_tensor(scale_tril) or scale_tril.dim() < 3 or scale_tril.shape[-2:] != (H, H):
            raise ValueError(
                f"RowwiseMultivariateNormal: scale_tril must have shape (..., {C}, {H}, {H}), "
                f"got {tuple(getattr(scale_tril, 'shape', ()))}"
            )
        if scale_tril.shape[-3] not in (1, C):
            raise ValueError(
                f"RowwiseMultivariateNormal: scale_tril has {scale_tril.shape[-3]} row blocks, loc has {C} rows"
            )
        try:
            batch_shape = torch.broadcast_shapes(loc.shape[:-2], scale_tril.shape[:-3])
        except RuntimeError as e:
            raise ValueError(f"RowwiseMultivariateNormal: batch shapes do not broadcast: {e}") from None
        self.loc = loc
        self.scale_tril = scale_tril.expand(scale_tril.shape[:-3] + (C, H, H))
        self._noise_cache: tuple[Tensor, Tensor] | None = None
        super().__init__(batch_shape, torch.Size((C, H)), validate_args=validate_args)

    def expand(self, batch_shape: torch.Size | tuple[int, ...], _instance: Any = None) -> RowwiseMultivariateNormal:
        new = self._get_checked_instance(RowwiseMultivariateNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        C, H = self.event_shape
        new.loc = self.loc.expand(batch_shape + (C, H))
        new.scale_tril = self.scale_tril.expand(batch_shape + (C, H, H))
        return self._expanded(new, batch_shape)

    @property
    def covariance_matrix(self) -> Tensor:
        """Per-row covariances ``L_c L_cᵀ``, shape batch + (C, H, H)."""
        return self.scale_tril @ self.scale_tril.mT

    @property
    def variance(self) -> Tensor:
        return self.scale_tril.pow(2).sum(-1).expand(self.batch_shape + self.event_shape)

    def _colour(self, eps: Tensor) -> Tensor:
        return (self.scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def _whiten(self, diff: Tensor) -> Tensor:
        return torch.linalg.solve_triangular(self.scale_tril, diff.unsqueeze(-1), upper=False).squeeze(-1)

    def _normalizer(self) -> Tensor:
        C, H = self.event_shape
        log_diag = self.scale_tril.diagonal(dim1=-2, dim2=-1).log()
        return 0.5 * C * H * _LOG_2PI + log_diag.expand(self.batch_shape + (C, H)).sum((-2, -1))


# --------------------------------------------------------------------------------------------
# Analytic KL divergences
# --------------------------------------------------------------------------------------------
def _diag_normal_params(q: torch.distributions.Distribution) -> tuple[Tensor, Tensor]:
    """(loc, scale) of ``q = Independent(Normal, 2)`` (nesting and ``ExpandedDistribution``
    unwrapped); both broadcastable to ``q.batch_shape + q.event_shape``. Anything else raises
    :class:`NotImplementedError` (so ELBOs fall back to Monte Carlo)."""
    ndims = 0
    base = q
    while isinstance(base, (Independent, ExpandedDistribution)):
        if isinstance(base, Independent):
            ndims += base.reinterpreted_batch_ndims
        base = base.base_dist
    if ndims != 2 or not isinstance(base, Normal):  # torch's signal for "no analytic KL": Pyro then samples
        raise NotImplementedError(f"no analytic KL against {type(q).__name__} of {type(base).__name__}")
    return base.loc, base.scale


def _kl_gaussian_diag_normal(
    p_loc: Tensor, p_var: Tensor, p_log_det: Tensor, q: torch.distributions.Distribution, batch_shape: torch.Size
) -> Tensor:
    """KL(N(m, Σ) ‖ N(μ, diag s²)) for (r, c) matrices given ``diag Σ`` (p_var), ``log|Σ|``:

    ½ [Σ var/s² + Σ (m − μ)²/s² − rc + Σ log s² − log|Σ|].
    """
    loc, scale = _diag_normal_params(q)
    event = p_loc.shape[-2:]
    var = scale.pow(2)
    full = torch.broadcast_shapes(var.shape, q.batch_shape + event)
    log_var_sum = var.log().expand(full).sum((-2, -1))
    quad = ((p_var + (p_loc - loc).pow(2)) / var).sum((-2, -1))
    kl = 0.5 * (quad - event.numel() + log_var_sum - p_log_det)
    return kl.expand(torch.broadcast_shapes(kl.shape, batch_shape))


@register_kl(MatrixNormal, Independent)
def _kl_matrix_normal_diag_normal(p: MatrixNormal, q: Independent) -> Tensor:
    r, c = p.event_shape
    if q.event_shape != p.event_shape:  # torch's signal for "no analytic KL": Pyro then samples
        raise NotImplementedError(f"no analytic KL between event shapes {p.event_shape} and {q.event_shape}")
    log_det = 2 * (c * _half_log_det(p.row_factor, p._row_diag) + r * _half_log_det(p.col_factor, p._col_diag))
    batch_shape = torch.broadcast_shapes(p.batch_shape, q.batch_shape)
    return _kl_gaussian_diag_normal(p.loc, p.variance, log_det, q, batch_shape)


@register_kl(MatrixNormal, MatrixNormal)
def _kl_matrix_normal_matrix_normal(p: MatrixNormal, q: MatrixNormal) -> Tensor:
    if p.event_shape != q.event_shape:
        raise ValueError("KL(MatrixNormal ‖ MatrixNormal): event shapes differ")
    r, c = p.event_shape
    # tr(U_q⁻¹ U_p) = ‖L_Uq⁻¹ L_Up‖²_F (same for V).
    tr_u = _left_solve(q.row_factor, q._row_diag, _dense(p.row_factor, p._row_diag)).pow(2).sum((-2, -1))
    tr_v = _left_solve(q.col_factor, q._col_diag, _dense(p.col_factor, p._col_diag)).pow(2).sum((-2, -1))
    z = _right_solve_t(_left_solve(q.row_factor, q._row_diag, p.loc - q.loc), q.col_factor, q._col_diag)
    maha = z.pow(2).sum((-2, -1))
    log_det_q = 2 * (c * _half_log_det(q.row_factor, q._row_diag) + r * _half_log_det(q.col_factor, q._col_diag))
    log_det_p = 2 * (c * _half_log_det(p.row_factor, p._row_diag) + r * _half_log_det(p.col_factor, p._col_diag))
    kl = 0.5 * (tr_u * tr_v + maha - r * c + log_det_q - log_det_p)
    return kl.expand(torch.broadcast_shapes(kl.shape, p.batch_shape, q.batch_shape))


@register_kl(RowwiseMultivariateNormal, Independent)
def _kl_rowwise_diag_normal(p: RowwiseMultivariateNormal, q: Independent) -> Tensor:
    if q.event_shape != p.event_shape:  # torch's signal for "no analytic KL": Pyro then samples
        raise NotImplementedError(f"no analytic KL between event shapes {p.event_shape} and {q.event_shape}")
    C, H = p.event_shape
    log_diag = p.scale_tril.diagonal(dim1=-2, dim2=-1).log()
    log_det = 2 * log_diag.expand(p.batch_shape + (C, H)).sum((-2, -1))
    batch_shape = torch.broadcast_shapes(p.batch_shape, q.batch_shape)
    return _kl_gaussian_diag_normal(p.loc, p.variance, log_det, q, batch_shape)


@register_kl(RowwiseMultivariateNormal, RowwiseMultivariateNormal)
def _kl_rowwise_rowwise(p: RowwiseMultivariateNormal, q: RowwiseMultivariateNormal) -> Tensor:
    if p.event_shape != q.event_shape:
        raise ValueError("KL(RowwiseMultivariateNormal ‖ RowwiseMultivariateNormal): event shapes differ")
    C, H = p.event_shape
    # Σ_c [tr(Σ_qc⁻¹ Σ_pc) + (μ_pc − μ_qc)ᵀ Σ_qc⁻¹ (μ_pc − μ_qc) − H + log|Σ_qc| − log|Σ_pc|] / 2
    tr = torch.linalg.solve_triangular(q.scale_tril, p.scale_tril, upper=False).pow(2).sum((-3, -2, -1))
    diff = (p.loc - q.loc).unsqueeze(-1)
    maha = torch.linalg.solve_triangular(q.scale_tril, diff, upper=False).pow(2).sum((-3, -2, -1))
    ld_q = q.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum((-2, -1))
    ld_p = p.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum((-2, -1))
    kl = 0.5 * (tr + maha - C * H) + ld_q - ld_p
    return kl.expand(torch.broadcast_shapes(kl.shape, p.batch_shape, q.batch_shape))


def _kl_delta(p: Delta, q: torch.distributions.Distribution) -> Tensor:
    """KL(Delta(v, log_density) ‖ q) = log_density − log q(v).

    Replaces Pyro 1.9's ``KL(Delta ‖ Distribution)`` (``−q.log_prob(v)``), which drops
    ``log_density``, inside :func:`corrected_delta_kl` only. Pyro's
    autoguides put the log-Jacobian of the constraining transform of each site in
    ``Delta.log_density``; without it :class:`~pyro.infer.TraceMeanField_ELBO` misses
    ``E_q[log|det ∂u/∂z|]`` on constrained sites (e.g. a LogNormal prior scale) and disagrees
    with :class:`~pyro.infer.Trace_ELBO` on the very same samples. For ``AutoDelta``
    (log_density = 0) nothing changes. NumPyro made the same fix (pyro-ppl/numpyro#1625).
    """
    return p.log_density - q.log_prob(p.v)


class DensityDelta(Delta):
    """Pyro's :class:`~pyro.distributions.Delta`, of the package's own type so that its KL keeps
    ``log_density``: ``KL(DensityDelta(v, log_density) ‖ q) = log_density − log q(v)``.

    A guide that draws a site through an auxiliary site and puts a ``Delta`` at the site holds part
    of log q in ``Delta.log_density`` (``−Σ log scale`` and the log-Jacobian of the constraining
    transform). With that rule :class:`~pyro.infer.TraceMeanField_ELBO` adds, on every draw, the
    same ``log p − log q`` as :class:`~pyro.infer.Trace_ELBO` -- an unbiased ELBO estimate whatever
    the guide's dependency structure -- under Pyro's own settings, inside or outside
    :func:`pyro_invariance.pyro_scope`. Everything else (``log_prob``, sampling, ``expand``) is
    ``Delta``'s, and it *is* a ``Delta`` for ``isinstance``.
    """

    @classmethod
    def of(cls, delta: Delta) -> DensityDelta:
        """The same point mass, value, log-density and event dim as ``delta``."""
        return cls(delta.v, delta.log_density, delta.event_dim)


@register_kl(DensityDelta, PyroDistribution)
def _kl_density_delta(p: DensityDelta, q: PyroDistribution) -> Tensor:
    return p.log_density - q.log_prob(p.v)


class DensityDeltaMessenger(Messenger):
    """Within the block (e.g. around an autoguide's ``forward``), every sample site whose distribution
    is exactly Pyro's ``Delta`` gets the equal :class:`DensityDelta` instead. Anything else, and a
    ``Delta`` wrapped in another distribution, is left as it is."""

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if type(msg["fn"]) is Delta:
            msg["fn"] = DensityDelta.of(msg["fn"])


_DELTA_KL_KEY = (Delta, PyroDistribution)


@contextlib.contextmanager
def corrected_delta_kl() -> Iterator[None]:
    """Use the corrected ``KL(Delta ‖ ·)`` (:func:`_kl_delta`) inside the block.

    Puts :func:`_kl_delta` in torch's KL registry under Pyro's own key ``(Delta, Distribution)``
    and clears torch's dispatch cache; on exit puts back whatever was there before (Pyro's
    function, or an enclosing block's) and clears the cache again, so code outside the block
    dispatches exactly as without this package. Process-wide while it lasts.
    """
    registry, missing = _torch_kl._KL_REGISTRY, object()
    before = registry.get(_DELTA_KL_KEY, missing)
    registry[_DELTA_KL_KEY] = _kl_delta
    _torch_kl._KL_MEMOIZE.clear()
    try:
        yield
    finally:
        if before is missing:
            registry.pop(_DELTA_KL_KEY, None)
        else:
            registry[_DELTA_KL_KEY] = before
        _torch_kl._KL_MEMOIZE.clear()
