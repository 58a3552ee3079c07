"""A scalar density on a grid, drawn by its exact inverse CDF.

:class:`PiecewiseLinear` is linear between the points of an increasing grid and 0 outside it: a
posterior over one symmetry parameter computed on a grid (e.g. the collapsed ``q(η)`` of
:mod:`research.uncertain_symmetry.collapsed_symmetry`).
"""

from __future__ import annotations

import torch
from pyro.distributions.torch_distribution import ExpandedDistribution, TorchDistribution
from torch import Tensor
from torch.distributions import constraints

__all__ = ["PiecewiseLinear"]


class PiecewiseLinear(TorchDistribution):
    r"""A scalar density linear between the points of an increasing grid ``g_0 < … < g_{G−1}``, 0 outside::

        p(x) = p_a + (p_b − p_a) (x − a) / h   on a cell [a, b] = [g_j, g_{j+1}], h = b − a,

    with ``density`` (the values p_j at the grid points) renormalised so that the trapezoidal rule
    gives 1 — the density :class:`~pyro_invariance.diagnostics.symmetry_posterior.GridPosterior` uses
    for its CDF, quantiles and moments. Draws are exact: a cell with probability its mass, then the
    root t ∈ [0, h] of ``p_a t + (p_b − p_a) t² / (2h) = r`` (r uniform on the cell's mass) in the
    cancellation-free form ``t = 2r / (p_a + √(p_a² + 2 (p_b − p_a) r / h))``. That inverse CDF of a
    uniform draw is the reparameterisation (``rsample``; differentiable in ``density`` within a cell).

    Args:
        grid: ``(G,)`` strictly increasing points, G ≥ 2.
        density: ``(G,)`` non-negative values at the points, not all 0 (any scale).
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, grid: Tensor, density: Tensor, validate_args: bool | None = None) -> None:
        grid, density = torch.as_tensor(grid), torch.as_tensor(density)
        if grid.ndim != 1 or grid.shape != density.shape or grid.numel() < 2:
            raise ValueError(
                f"PiecewiseLinear: grid and density must be 1-D of one length >= 2, got "
                f"{tuple(grid.shape)} and {tuple(density.shape)}"
            )
        if not bool((grid.diff() > 0).all()) or not bool(torch.isfinite(grid).all()):
            raise ValueError("PiecewiseLinear: grid must be finite and strictly increasing")
        if not bool(torch.isfinite(density).all()) or bool((density < 0).any()) or not bool((density > 0).any()):
            raise ValueError("PiecewiseLinear: density must be finite, non-negative and not all 0")
        density = density.to(grid.dtype)
        width = grid.diff()
        cells = 0.5 * (density[1:] + density[:-1]) * width
        total = cells.sum()
        self.grid, self.density, self._width = grid, density / total, width
        self._cells = cells / total
        self._cumulative = torch.cat([cells.new_zeros(1), torch.cumsum(self._cells, 0)])
        super().__init__(batch_shape=torch.Size(), event_shape=torch.Size(), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.interval(self.grid[0], self.grid[-1])

    def _cell(self, value: Tensor) -> Tensor:
        return (torch.searchsorted(self.grid, value.contiguous(), right=True) - 1).clamp(0, self.grid.numel() - 2)

    def log_prob(self, value: Tensor) -> Tensor:
        value = torch.as_tensor(value, dtype=self.grid.dtype, device=self.grid.device)
        j = self._cell(value)
        a, h = self.grid[j], self._width[j]
        pa, pb = self.density[j], self.density[j + 1]
        p = pa + (pb - pa) * ((value - a) / h).clamp(0.0, 1.0)
        inside = (value >= self.grid[0]) & (value <= self.grid[-1])
        return torch.where(inside, p, torch.zeros_like(p)).log()

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        u = torch.rand(sample_shape, dtype=self.grid.dtype, device=self.grid.device)
        j = (torch.searchsorted(self._cumulative.detach(), u.contiguous(), right=True) - 1).clamp(
            0, self.grid.numel() - 2
        )
        r = (u - self._cumulative[j]).clamp(min=0.0)
        pa, pb, h = self.density[j], self.density[j + 1], self._width[j]
        root = (pa * pa + 2.0 * (pb - pa) * r / h).clamp(min=0.0).sqrt()
        denom = pa + root
        t = torch.where(denom > 0, 2.0 * r / denom.clamp(min=torch.finfo(u.dtype).tiny), torch.zeros_like(r))
        return self.grid[j] + torch.minimum(t, h)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def cdf(self, value: Tensor) -> Tensor:
        value = torch.as_tensor(value, dtype=self.grid.dtype, device=self.grid.device)
        j = self._cell(value)
        pa, pb, h = self.density[j], self.density[j + 1], self._width[j]
        t = (value - self.grid[j]).clamp(min=0.0)
        t = torch.minimum(t, h)
        return (self._cumulative[j] + pa * t + (pb - pa) * t * t / (2.0 * h)).clamp(0.0, 1.0)

    @property
    def mean(self) -> Tensor:
        a, b, pa, pb, h = self.grid[:-1], self.grid[1:], self.density[:-1], self.density[1:], self._width
        return (h * (pa * (2 * a + b) + pb * (a + 2 * b)) / 6.0).sum()

    @property
    def variance(self) -> Tensor:
        a, b, pa, pb, h = self.grid[:-1], self.grid[1:], self.density[:-1], self.density[1:], self._width
        m2 = (h * (pa * (3 * a * a + 2 * a * b + b * b) + pb * (a * a + 2 * a * b + 3 * b * b)) / 12.0).sum()
        return (m2 - self.mean**2).clamp(min=0.0)

    def expand(self, batch_shape, _instance=None):  # type: ignore[override]
        return ExpandedDistribution(self, batch_shape)
