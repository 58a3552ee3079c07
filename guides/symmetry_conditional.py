"""A guide in which the weights' distribution depends on the symmetry: ``q(η) q(θ | η)``.

For a model with a latent η (``symmetry_prior``, :mod:`pyro_invariance.symmetry.priors`) the
mean-field guide ``q(θ) q(η)`` cannot express that the weights that explain the data change with
the amount of invariance (e.g. basis regression: the posterior mean of the weights is a function
of λ). This guide is Pyro's :class:`~pyro.infer.autoguide.AutoStructured` with

* a diagonal Normal (``"normal"``) for every latent site, in unconstrained space;
* a **linear** dependency of every non-symmetry site on every symmetry site
  (``model.symmetry_sites()``)::

      u_η = m_η + s_η ⊙ ε_η,          u_θ = m_θ + s_θ ⊙ ε_θ + B (u_η − m_η),

  where ``u`` are unconstrained coordinates and ``B`` (``numel(θ) × numel(η)``, initialised at 0,
  so the guide starts as the mean-field one) is learned — a linear-Gaussian ``q(θ | η)``.

The dependencies are set from the model's prototype trace (``_auto_config``), so the guide needs
no site names. **A model without latent symmetry sites** (a catalogue model with η a point estimate
or fixed, or any model that is not a catalogue model: the symmetry sites are those of
``model.symmetry_sites()``) gets no dependency: a diagonal Normal per unconstrained coordinate, the
same family, initialisation and bound as the ``mean-field`` guide (it draws through auxiliary sites,
so its KLs are Monte Carlo where ``mean-field``'s are analytic). It is accepted, so that one list of
guides can be crossed with models with and without a latent η
(``compare_guides(..., symmetry_priors=(None, "uniform"))``).

**A valid bound under Pyro's defaults.** Each latent site is a ``Delta`` whose ``log_density`` holds
part of log q (``−Σ log s`` and the log-Jacobian of the support's transform). The guide puts the
package's :class:`~pyro_invariance.distributions.DensityDelta` there, whose KL keeps that term
(registered at import), so :class:`~pyro.infer.TraceMeanField_ELBO` adds on every draw the same
``log p − log q`` as :class:`~pyro.infer.Trace_ELBO`, in a plain ``pyro.infer.SVI`` loop as inside
the package's calls (Pyro's own ``KL(Delta ‖ ·)`` drops it: the estimate was 11–16 nats above the
exact log evidence of a five-weight regression). It samples the sites in the model's order (the
auxiliary draws, η's first, come before), so that ``TraceMeanField_ELBO``'s order check passes.

``symmetry_density="spline"`` replaces the Gaussian noise of q(u_η) by a monotone rational-linear
spline flow (Pyro's :class:`~pyro.distributions.transforms.Spline`, Dolatabadi et al. 2020) of a
standard Normal, then a learned scale::

      u_η = m_η + s_η ⊙ g(ε_η),     g a per-coordinate spline on [−B, B] (identity outside),

so q(η) can have the sharp top and heavy shoulders an exact posterior over a symmetry may have
(basis regression: kurtosis 8.8, ``research/uncertain_symmetry/results/symmetry_posterior_basis.md``). ``g`` starts
as the identity (uniform bins, unit slopes), i.e. as the Gaussian guide. θ | η is unchanged.

``symmetry_dependence="rbf"`` makes q(θ | η)'s location a smooth *nonlinear* function of η: the
linear term plus Gaussian bumps of the absolute unconstrained coordinate ``u_η``::

      u_θ = m_θ + s_θ ⊙ ε_θ + B (u_η − m_η) + C ψ(u_η),
      ψ_k(u) = exp(−(u − c_k)² / 2w²),   c_k = −4, −3, …, 4,   w = 1,

(per η coordinate; ``C`` initialised at 0). The bumps sit at fixed places of η's unconstrained
coordinate (for η ∈ [0, π]: u = logit(η/π), so c_k spans η ≈ 0.06 … 3.08), not relative to m_η, so
what q(θ | η) learned about some η stays attached to that η while q(η) moves. A linear q(θ | η) is
good only near the η it was trained at (the amortisation profile of
``research/uncertain_symmetry/results/uncertain_symmetry_iwae_steps4000.md``); the bumps let one guide
hold a different weight location for every region of η, e.g. after training it across a wide q(η)
(a warm-up with q(η) held: :meth:`~pyro_invariance.guides.base.CatalogueGuide.symmetry_guide_parameters`).
The shear stays
triangular, so the density is unchanged by it; marginal quantiles of θ are then Monte-Carlo.

``symmetry_init_scale``: the initial scale ``s_η`` of q(u_η) (default: ``init_scale``). With
U(0, π)'s logistic spread in u, π/√3, q(η) starts as wide as the prior.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from operator import attrgetter
from typing import Any

import pyro
import pyro.distributions as dist
import pyro.distributions.transforms as T
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoStructured
from pyro.infer.autoguide.initialization import init_to_feasible
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.transforms import AffineTransform

from pyro_invariance.distributions import DensityDelta
from pyro_invariance.models.base import CatalogueModel
from pyro_invariance.registry import GUIDES

from .base import DEFAULT_INIT_SCALE, CatalogueGuide, InitLocFn, check_init_scale

#: ``symmetry_density``: the noise of q(u_η)
SYMMETRY_DENSITIES = ("normal", "spline")
#: ``weight_covariance``: the covariance of q(θ | η) within each weight site: diagonal or full (Pyro's "mvn")
WEIGHT_COVARIANCES = ("normal", "mvn")
#: the spline's bins and its interval [−B, B] in units of the standard-Normal ε (fixed before any fit)
SPLINE_BINS, SPLINE_BOUND = 8, 4.0
#: ``symmetry_dependence``: how q(θ | η)'s location depends on η
SYMMETRY_DEPENDENCES = ("linear", "rbf")
#: the bumps of ``"rbf"``: centres and width in η's unconstrained coordinate (fixed before any fit)
RBF_CENTRES, RBF_WIDTH = tuple(float(c) for c in range(-4, 5)), 1.0
#: Monte-Carlo draws for the marginal quantiles of a nonlinear q(θ | η)
QUANTILE_DRAWS = 8192

__all__ = ["SymmetryConditional", "symmetry_conditional"]


class SplineNoise(PyroModule):
    """Zero-centred noise ``s ⊙ g(ε)``, ε ~ N(0, I_d), ``g`` a monotone spline per coordinate, sampled
    as the auxiliary site ``<site>_aux`` with its exact density (AutoStructured adds ``m_η``)."""

    def __init__(self, site: str, dim: int, init_scale: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.site = site
        self.spline = T.Spline(dim, count_bins=SPLINE_BINS, bound=SPLINE_BOUND)
        with torch.no_grad():  # the identity: uniform bins, slopes 1 (min_derivative + softplus(u) = 1)
            self.spline.unnormalized_widths.zero_()
            self.spline.unnormalized_heights.zero_()
            self.spline.unnormalized_derivatives.fill_(math.log(math.expm1(1.0 - 1e-3)))
            self.spline.unnormalized_lambdas.zero_()
        self.spline.to(dtype)
        self.scale = PyroParam(torch.full((dim,), init_scale, dtype=dtype), constraint=constraints.softplus_positive)

    def distribution(self) -> dist.TorchDistribution:
        scale = self.scale
        base = dist.Normal(torch.zeros_like(scale), torch.ones_like(scale)).to_event(1)
        return dist.TransformedDistribution(base, [self.spline, AffineTransform(0.0, scale, event_dim=1)])

    def forward(self) -> Tensor:
        return pyro.sample(f"{self.site}_aux", self.distribution(), infer={"is_auxiliary": True})

    @torch.no_grad()
    def icdf(self, q: Tensor) -> Tensor:
        """Quantiles per coordinate, ``(len(q), dim)``: ``s ⊙ g(Φ⁻¹(q))`` (g and s monotone)."""
        z = dist.Normal(0.0, 1.0).icdf(q.to(self.scale.dtype)).unsqueeze(-1).expand(len(q), self.scale.numel())
        return self.spline(z) * self.scale

    @torch.no_grad()
    def moments(self, num_samples: int = 8192) -> tuple[Tensor, Tensor]:
        """Monte-Carlo mean and variance per coordinate (for the Gaussian part of θ's quantiles)."""
        draws = self.distribution().sample((num_samples,))
        return draws.mean(0), draws.var(0)


class RBFDependence(torch.nn.Module):
    """``B (u_η − m_η) + C ψ(u_η)`` (module docstring): Pyro's ``AutoStructured`` passes the upstream
    noise ``u_η − m_η``; the absolute ``u_η`` adds the guide's current ``m_η`` back. The guide is held
    outside the module tree (no parameter is registered twice; a deep copy of the guide carries it)."""

    def __init__(self, guide: SymmetryConditional, upstream: str, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.__dict__["_guide"] = guide
        self.upstream = upstream
        self.linear = torch.nn.Linear(in_dim, out_dim, bias=False)
        self.bumps = torch.nn.Linear(in_dim * len(RBF_CENTRES), out_dim, bias=False)
        self.register_buffer("centres", torch.tensor(RBF_CENTRES))
        with torch.no_grad():
            self.linear.weight.zero_()
            self.bumps.weight.zero_()

    def features(self, u: Tensor) -> Tensor:
        """ψ(u): ``(..., in_dim) -> (..., in_dim · len(RBF_CENTRES))``."""
        return torch.exp(-0.5 * ((u.unsqueeze(-1) - self.centres) / RBF_WIDTH).square()).flatten(-2)

    def forward(self, aux: Tensor) -> Tensor:
        loc = attrgetter(self.upstream)(self._guide.locs)
        return self.linear(aux) + self.bumps(self.features(aux + loc))


class SymmetryConditional(CatalogueGuide, AutoStructured):
    """``AutoStructured`` with ``q(θ | η)`` linear in η, or linear plus fixed bumps
    (``symmetry_dependence="rbf"``; see the module docstring).

    ``fit_defaults``: ``elbo="trace"`` — this guide's KL terms are Monte-Carlo estimates under either
    ELBO (every site is a ``Delta`` drawn through an auxiliary site), so ``TraceMeanField_ELBO`` gains
    nothing; it gives the same, valid, estimate (module docstring).
    """

    fit_defaults = {"elbo": "trace"}
    catalogue_name = "symmetry-conditional"

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: InitLocFn = init_to_feasible,
        init_scale: float = DEFAULT_INIT_SCALE,
        symmetry_density: str = "normal",
        weight_covariance: str = "normal",
        symmetry_dependence: str = "linear",
        symmetry_init_scale: float | None = None,
    ) -> None:
        if symmetry_density not in SYMMETRY_DENSITIES:
            raise ValueError(f"unknown symmetry_density {symmetry_density!r}; use one of {list(SYMMETRY_DENSITIES)}")
        if symmetry_dependence not in SYMMETRY_DEPENDENCES:
            raise ValueError(
                f"unknown symmetry_dependence {symmetry_dependence!r}; use one of {list(SYMMETRY_DEPENDENCES)}"
            )
        self.symmetry_dependence = symmetry_dependence
        self.symmetry_init_scale = check_init_scale(init_scale if symmetry_init_scale is None else symmetry_init_scale)
        self._symmetry_sites = list(model.symmetry_sites()) if isinstance(model, CatalogueModel) else []
        if weight_covariance not in WEIGHT_COVARIANCES:
            raise ValueError(f"unknown weight_covariance {weight_covariance!r}; use one of {list(WEIGHT_COVARIANCES)}")
        self.symmetry_density, self.weight_covariance = symmetry_density, weight_covariance
        super().__init__(
            model,
            conditionals="normal",
            dependencies={},
            init_loc_fn=init_loc_fn,
            init_scale=check_init_scale(init_scale),
        )

    def _auto_config(self, sample_sites: dict[str, Any], args: tuple, kwargs: dict) -> None:
        """Every latent site that is not a symmetry site depends linearly on every symmetry site."""
        missing = [s for s in self._symmetry_sites if s not in sample_sites]
        if missing:
            raise ValueError(f"the model declares symmetry sites {missing} that its trace does not sample")
        numel = {
            name: biject_to(site["fn"].support).inv(site["value"].detach()).numel()
            for name, site in sample_sites.items()
        }

        def dependence(name: str, upstream: str) -> str | RBFDependence:
            if self.symmetry_dependence == "linear":
                return "linear"
            return RBFDependence(self, upstream, numel[upstream], numel[name])

        self.dependencies = {
            name: {s: dependence(name, s) for s in self._symmetry_sites}
            for name in sample_sites
            if name not in self._symmetry_sites
        }
        self.conditionals = {name: self.weight_covariance for name in sample_sites}
        if self.symmetry_density == "spline":
            for name in self._symmetry_sites:
                site = sample_sites[name]
                unconstrained = biject_to(site["fn"].support).inv(site["value"].detach())
                noise = SplineNoise(name, unconstrained.numel(), self.symmetry_init_scale, unconstrained.dtype)
                self.conditionals[name] = noise.to(unconstrained.device)
        super()._auto_config(sample_sites, args, kwargs)

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        # Pyro builds the "linear" dependencies as nn.Linear in the default dtype, on the CPU: follow the
        # model's dtype and device (a float64 or a CUDA model would otherwise mix them in B (u_η − m_η)).
        loc = next(iter(self.locs.parameters()))
        self.deps.to(device=loc.device, dtype=loc.dtype)
        if self.symmetry_init_scale != self._init_scale:
            for name in self._symmetry_sites:
                if self.conditionals[name] in ("normal", "mvn"):
                    start = torch.full_like(attrgetter(name)(self.scales), self.symmetry_init_scale)
                    deep_setattr(self.scales, name, PyroParam(start, self.scale_constraint))

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Draw every latent site; returns ``{name: value}``. ``AutoStructured.forward`` with the
        package's :class:`~pyro_invariance.distributions.DensityDelta` at each site (its KL keeps the
        log-density) and the sites in the model's order (the auxiliary draws, in dependency order, come
        first), so that ``TraceMeanField_ELBO`` is a valid bound and checks the order without a warning."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        deltas = self.get_deltas()
        plates = self._create_plates(*args, **kwargs)
        sites = dict(self._sorted_sites)
        result = {}
        for name in [n for n in self.prototype_trace.nodes if n in sites]:
            with ExitStack() as stack:
                for frame in sites[name]["cond_indep_stack"]:
                    if frame.vectorized:
                        stack.enter_context(plates[frame.name])
                result[name] = pyro.sample(name, DensityDelta.of(deltas[name]))
        return result

    def symmetry_condition(self, site: str, value: Tensor) -> dict[str, Tensor]:
        """``{"<site>_aux": ε}`` with the noise ε that puts u_η at ``biject_to(support).inv(value)``: q(θ | η)
        reads η through that noise (``B (u_η − m_η)``), so conditioning the site alone would leave θ drawn
        at another η. Normal: ε = (u − m)/s; "mvn": ε = L⁻¹ (u − m)/s (Pyro draws ``ε Lᵀ s``); spline: the
        auxiliary is the centred noise itself, u − m."""
        support = dict(self._sorted_sites)[site]["fn"].support
        loc = attrgetter(site)(self.locs)
        centred = biject_to(support).inv(torch.as_tensor(value, dtype=loc.dtype, device=loc.device)).reshape(-1) - loc
        conditional = self.conditionals[site]
        if isinstance(conditional, SplineNoise):
            return {f"{site}_aux": centred}
        scaled = centred / attrgetter(site)(self.scales)
        if conditional == "mvn":
            tril = attrgetter(site)(self.scale_trils)
            scaled = torch.linalg.solve_triangular(tril, scaled.unsqueeze(-1), upper=False).squeeze(-1)
        return {f"{site}_aux": scaled}

    def _own_variance(self, name: str) -> Tensor:
        """Variance of a site's own noise per unconstrained coordinate: ``s²`` ("normal") or
        ``s² ⊙ diag(L Lᵀ)`` ("mvn", Pyro's ``aux @ Lᵀ * s``)."""
        scale = attrgetter(name)(self.scales)
        if self.conditionals.get(name) == "mvn":
            return scale.pow(2) * attrgetter(name)(self.scale_trils).pow(2).sum(-1)
        return scale.pow(2)

    @torch.no_grad()
    def quantiles(self, quantiles: Sequence[float] | Tensor, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Marginal quantiles per site, ``{site: (len(quantiles), *site_shape)}``.

        Each unconstrained coordinate is Gaussian with mean ``m`` and variance
        ``s² + Σ_j B_ij² Var(u_ηj)`` (its own scale plus what it inherits from η through ``B``); the
        quantiles are mapped through the site's ``biject_to`` (monotone per coordinate). With
        ``symmetry_density="spline"`` η's quantiles are exact (the spline is monotone) and a weight
        coordinate's inherited part ``B (u_η − m_η)`` is approximated as Gaussian with the spline
        noise's Monte-Carlo mean and variance."""
        if not hasattr(self, "_sorted_sites"):
            self._setup_prototype(*args, **kwargs)
        q = torch.as_tensor(quantiles)
        if self.symmetry_dependence != "linear":
            return self._sampled_quantiles(q)
        spline = {
            name: attrgetter(name)(self.conds)
            for name, _ in self._sorted_sites
            if isinstance(self.conditionals.get(name), SplineNoise)
        }
        moments = {
            name: (spline[name].moments() if name in spline else (0.0, self._own_variance(name)))
            for name, _ in self._sorted_sites
        }
        out = {}
        for name, site in self._sorted_sites:
            loc = attrgetter(name)(self.locs)
            if name in spline:  # exact: u_η = m_η + s ⊙ g(ε), monotone per coordinate
                values = loc + spline[name].icdf(q)
            else:
                mean, var = loc, moments[name][1]
                deps = attrgetter(name)(self.deps)
                for upstream in self.dependencies.get(name, {}):
                    weight = attrgetter(upstream)(deps).weight  # (numel θ, numel η)
                    up_mean, up_var = moments[upstream]
                    mean = mean + weight @ up_mean if torch.is_tensor(up_mean) else mean
                    var = var + (weight.pow(2) * up_var).sum(-1)
                normal = dist.Normal(mean, var.sqrt())
                values = torch.stack([normal.icdf(torch.as_tensor(v, dtype=loc.dtype)) for v in q])
            shape = self._batch_shapes[name] + self._unconstrained_event_shapes[name]
            out[name] = biject_to(site["fn"].support)(values.reshape((len(q),) + shape))
        return out

    def _sampled_quantiles(self, q: Tensor) -> dict[str, Tensor]:
        """Marginal quantiles from ``QUANTILE_DRAWS`` joint draws (seeded: the RNG is restored), for a
        nonlinear q(θ | η); per coordinate, so the support's monotone map commutes with them."""
        with torch.random.fork_rng(devices=[]), pyro.poutine.block():
            torch.manual_seed(0)
            nesting = max(len(shape) for shape in self._batch_shapes.values())
            with pyro.plate("_quantile_draws", QUANTILE_DRAWS, dim=-1 - nesting):
                deltas = self.get_deltas()
        out = {}
        for name, _ in self._sorted_sites:
            values = deltas[name].v.reshape(QUANTILE_DRAWS, -1)
            level = torch.as_tensor(q, dtype=values.dtype, device=values.device)
            out[name] = torch.quantile(values, level, dim=0).reshape((len(q),) + deltas[name].v.shape[1:])
        return out


@GUIDES.register(
    "symmetry-conditional",
    summary="q(η) q(θ | η): weights linear-Gaussian in a latent η (AutoStructured); mean-field without one",
)
def symmetry_conditional(
    model: Callable,
    *,
    init_loc_fn: InitLocFn = init_to_feasible,
    init_scale: float = DEFAULT_INIT_SCALE,
    symmetry_density: str = "normal",
    weight_covariance: str = "normal",
    symmetry_dependence: str = "linear",
    symmetry_init_scale: float | None = None,
) -> SymmetryConditional:
    """Diagonal Normal per site, with every weight site's location linear in the latent η's coordinates;
    ``symmetry_density="spline"``: q(η) a spline flow instead of a Normal; ``symmetry_dependence="rbf"``:
    the location also a sum of fixed Gaussian bumps in η; ``symmetry_init_scale``: q(η)'s initial
    scale (module docstring). On a model without latent symmetry sites (``model.symmetry_sites()``;
    none for a model that is not a catalogue model) it is the ``mean-field`` family: no dependency."""
    return SymmetryConditional(
        model,
        init_loc_fn=init_loc_fn,
        init_scale=init_scale,
        symmetry_density=symmetry_density,
        weight_covariance=weight_covariance,
        symmetry_dependence=symmetry_dependence,
        symmetry_init_scale=symmetry_init_scale,
    )
