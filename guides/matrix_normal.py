"""Matrix-normal guide: a Kronecker-structured Gaussian per weight matrix (Noether's razor).

For every weight-matrix site ``W`` of shape ``(r, c)`` (rows = outputs/classes, columns =
inputs; see :func:`~pyro_invariance.guides.base.is_matrix_site`)::

    q(W) = MatrixNormal(M, L_U, L_V):   W = M + L_U E L_Vᵀ,   vec_r(W) ~ N(vec_r M, U ⊗ V),

with ``U = L_U L_Uᵀ`` (r×r, among rows) and ``V = L_V L_Vᵀ`` (c×c, among columns)
(docs/methods.md §4; the reference writes ``W = M + L_s E L_a``). Every other latent site (biases,
positive prior scales, ...) gets a mean-field Normal (:class:`StructuredGuide`). Under
:class:`~pyro.infer.TraceMeanField_ELBO` the KL of each matrix site to a
``Normal(...).to_event(2)`` prior is analytic.

Parameterisation of a factor ``L`` (n×n): ``L = diag(d)·T`` with ``d > 0`` (softplus) and ``T``
unit lower triangular -- or, for a *diagonal* factor, ``L = diag(d)`` only.

Scale ambiguity: ``(L_U, L_V) → (a·L_U, L_V/a)`` gives the same distribution. The guide fixes it
by pinning the first diagonal element of the column factor, ``d_V[0] = 1`` (so ``V₀₀ = 1``; the
row factor carries the overall scale). With ``freeze_row_factor=True`` the row factor is held at
its initial value ``init_scale·I`` (a buffer, not a parameter -- the Noether's-razor reference's
option) and the column factor is learned without any pinned element.

Initialisation: ``M`` from ``init_loc_fn`` (default 0), ``L_U = init_scale·I``, ``L_V = I``, so
``q`` starts as ``N(M, init_scale²·I)``, like the mean-field guide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pyro.distributions import constraints
from pyro.infer.autoguide.initialization import init_to_feasible
from pyro.nn import PyroModule, PyroParam
from torch import Tensor

from pyro_invariance.distributions import MatrixNormal
from pyro_invariance.registry import GUIDES

from .base import DEFAULT_INIT_SCALE, InitLocFn, SiteSelector, StructuredGuide, is_matrix_site

__all__ = ["DiagonalFactors", "MatrixNormalGuide", "MatrixNormalSite"]


class MatrixNormalSite(PyroModule):
    """Parameters of ``q(W) = MatrixNormal(M, L_U, L_V)`` for one ``(r, c)`` site.

    The attributes hold constrained values.

    Attributes:
        loc: ``M`` (r, c).
        row_scale: ``d_U`` (r,) -- or the buffer ``row_scale_fixed`` when the row factor is frozen.
        row_tril: ``T_U`` (r, r) unit lower triangular (absent when the row factor is diagonal).
        col_scale: ``d_V[1:]`` (c−1,) when ``d_V[0]`` is pinned to 1, else ``d_V`` (c,).
        col_tril: ``T_V`` (c, c) unit lower triangular (absent when the column factor is diagonal).
    """

    def __init__(
        self,
        init_loc: Tensor,
        init_scale: float,
        *,
        row_diagonal: bool = False,
        col_diagonal: bool = False,
        freeze_row_factor: bool = False,
    ) -> None:
        super().__init__()
        r, c = init_loc.shape
        self.row_diagonal = bool(row_diagonal or freeze_row_factor)  # a frozen init factor is diagonal
        self.col_diagonal = bool(col_diagonal)
        self.freeze_row_factor = bool(freeze_row_factor)
        self.pin_col_scale = not freeze_row_factor
        like = dict(dtype=init_loc.dtype, device=init_loc.device)
        self.loc = PyroParam(init_loc.clone(), constraints.real, event_dim=2)
        if self.freeze_row_factor:
            self.register_buffer("row_scale_fixed", torch.full((r,), init_scale, **like))
        else:
            self.row_scale = PyroParam(torch.full((r,), init_scale, **like), constraints.softplus_positive, 1)
            if not self.row_diagonal:
                self.row_tril = PyroParam(torch.eye(r, **like), constraints.unit_lower_cholesky, 2)
        n_free = c - 1 if self.pin_col_scale else c
        if n_free > 0:
            self.col_scale = PyroParam(torch.ones(n_free, **like), constraints.softplus_positive, 1)
        if not self.col_diagonal and c > 1:
            self.col_tril = PyroParam(torch.eye(c, **like), constraints.unit_lower_cholesky, 2)
        self._shape = (r, c)

    def row_factor(self) -> Tensor:
        """``L_U``: (r, r), or (r,) when diagonal."""
        if self.freeze_row_factor:
            return self.row_scale_fixed
        d = self.row_scale
        return d if self.row_diagonal else d.unsqueeze(-1) * self.row_tril

    def col_factor(self) -> Tensor:
        """``L_V``: (c, c), or (c,) when diagonal."""
        r, c = self._shape
        if self.pin_col_scale:
            one = self.loc.new_ones(1)
            d = torch.cat([one, self.col_scale]) if c > 1 else one
        else:
            d = self.col_scale
        if self.col_diagonal or c == 1:
            return d
        return d.unsqueeze(-1) * self.col_tril

    def distribution(self) -> MatrixNormal:
        """``MatrixNormal(M, L_U, L_V)`` at the current parameters."""
        row, col = self.row_factor(), self.col_factor()
        kw: dict[str, Tensor] = {}
        kw["scale_row" if row.dim() == 1 else "scale_tril_row"] = row
        kw["scale_col" if col.dim() == 1 else "scale_tril_col"] = col
        return MatrixNormal(self.loc, **kw)


class DiagonalFactors:
    """Which Kronecker factors are diagonal, from the ``diagonal_factors`` option (picklable).

    ``None``/``False``: none; ``True``: all; ``int`` n: a factor of size > n; iterable of site
    names: both factors of those sites; callable ``(site, "row" | "col", size) -> bool``.
    """

    def __init__(self, spec: SiteSelector) -> None:
        self.names: frozenset | None = None
        if isinstance(spec, str):
            spec = [spec]
        if spec is None or isinstance(spec, bool):
            self.spec: Any = bool(spec)
        elif isinstance(spec, int):
            if spec < 0:
                raise ValueError(f"diagonal_factors threshold must be >= 0, got {spec}")
            self.spec = spec
        elif callable(spec):
            self.spec = spec
        else:
            try:
                names = frozenset(spec)
            except TypeError:
                names = None
            if names is None or not all(isinstance(n, str) for n in names):
                raise ValueError(
                    f"diagonal_factors must be a bool, an int size threshold, site names or a callable, got {spec!r}"
                )
            self.spec = self.names = names

    def __call__(self, name: str, which: str, size: int) -> bool:
        if isinstance(self.spec, bool):
            return self.spec
        if isinstance(self.spec, int):
            return size > self.spec
        if isinstance(self.spec, frozenset):
            return name in self.spec
        return bool(self.spec(name, which, size))


@GUIDES.register("matrix-normal", summary="matrix-normal (Kronecker) Gaussian per weight matrix, mean-field elsewhere")
class MatrixNormalGuide(StructuredGuide):
    """Matrix-normal guide over weight matrices, mean-field Normal over all other sites.

    Args:
        model: a Pyro model.
        init_loc_fn: initialisation of the means (default ``init_to_feasible``: ``M = 0``).
        init_scale: initial standard deviation (default :data:`~.base.DEFAULT_INIT_SCALE`, 0.1; the
            row factor starts at ``init_scale·I``, the column factor at ``I``).
        diagonal_factors: which Kronecker factors are diagonal instead of full lower-triangular:
            ``None``/``False`` (none), ``True`` (all), an ``int`` threshold (a factor of size
            ``n > threshold`` is diagonal -- keeps wide/conv layers affordable), an iterable of
            site names (both factors of those sites), or a callable
            ``(site_name, "row" | "col", size) -> bool``.
        freeze_row_factor: keep the row factor fixed at ``init_scale·I`` (not trained).
        create_plates: as in Pyro's autoguides.

    Raises:
        ValueError: ``init_scale <= 0``, a bad ``diagonal_factors`` value, or (on the first call)
            ``diagonal_factors`` naming a site that is not a weight-matrix site.
    """

    catalogue_name = "matrix-normal"

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: InitLocFn = init_to_feasible,
        init_scale: float = DEFAULT_INIT_SCALE,
        diagonal_factors: SiteSelector = None,
        freeze_row_factor: bool = False,
        create_plates: Callable | None = None,
    ) -> None:
        self.diagonal_factors = DiagonalFactors(diagonal_factors)
        self.freeze_row_factor = bool(freeze_row_factor)
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=init_scale, create_plates=create_plates)

    def _is_structured(self, name: str, site: dict) -> bool:
        return is_matrix_site(site)

    def _check_setup(self) -> None:
        names = self.diagonal_factors.names
        if names:
            matrix_sites = [n for n, s in self.prototype_trace.iter_stochastic_nodes() if is_matrix_site(s)]
            unknown = sorted(names - set(matrix_sites))
            if unknown:
                raise ValueError(
                    f"diagonal_factors names {unknown}, which are not weight-matrix sites; matrix sites: {matrix_sites}"
                )

    def _make_structured(self, name: str, site: dict, init_loc: Tensor) -> MatrixNormalSite:
        r, c = init_loc.shape
        return MatrixNormalSite(
            init_loc,
            self._init_scale,
            row_diagonal=self.diagonal_factors(name, "row", r),
            col_diagonal=self.diagonal_factors(name, "col", c),
            freeze_row_factor=self.freeze_row_factor,
        )
