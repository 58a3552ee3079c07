"""Symmetrised Bayesian Hamiltonian neural network (Noether's razor; talk 000, docs/methods.md §4).

Generative story (talk 000, "Noether's theorem parameterisation" and "Objective function")::

    v_l                                       prior variance of layer l: fixed, closed-form
                                              (v* = (tr Σ + ‖m‖²)/D, :mod:`pyro_invariance.infer.prior_update`)
                                              or hierarchical (√v_l ~ LogNormal(log √v₀, 1))
    W_l ~ N(0, v_l I)   (out × in)            Bayesian weights; biases b_l and the first layer's
                                              scalar scale c are point estimates; last layer has no bias
    f(x) = W_L ELU_α(... ELU_α(c·W_1 x/√M + b_1) ...)/√H       the MLP "observable" F (ELU α = 2)
    η = (W_k, b_k), k = 1..K                  quadratic conserved quantities (learned by the bound;
                                              with ``symmetry_prior="normal"`` latent sites
                                              "eta_W", "eta_b" with N(0, 1) entries: full Bayes)
    C_k(x) = xᵀA_k x/2 + b_kᵀx,  A_k = W_k + W_kᵀ,  G_k = [[J A_k, J b_k], [0, 0]]
    T_s = expm(π Σ_k w_sk G_k),  w_s ~ U[−1,1]^K (or the unit ball), s = 1..S
    H̄(x) = (1/S) Σ_s f([T_s [x; 1]]_{1:M})                           (talk: NN_{θ,η} = ∫ NN_θ∘Φ^τ dμ)
    x̂ = E explicit-Euler sub-steps of ẋ = J∇H̄(x) with step dt/E       (∇ by autograd)
    y_n ~ N(x̂_n, σ² I)   (σ = √0.001 fixed, or learned)             in a subsampled plate "data"

The S flow matrices are computed once per forward pass, shared by the batch and reused across
all E Euler sub-steps. ``symmetry="quadratic"`` (default) is the family above, with η learned
(``learn_symmetry=True``) or held at its random start; ``symmetry="none"`` is the plain Bayesian
HNN; ``"so2"``, ``"un"``, ``"se2"`` use the fixed oracle generators of
:mod:`pyro_invariance.symmetry.conserved` instead of η.

Parameterisation note: each layer's input is divided by √fan_in (NTK-style), so that unit prior
variance gives O(1) activations at any width; the first layer's learned scalar scale c
(``input_scale``) sets the input length-scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.autoguide.initialization import init_to_feasible
from pyro.nn import PyroSample
from torch import Tensor, nn

from pyro_invariance.data import physics  # noqa: F401  (registers the physics datasets)
from pyro_invariance.data.physics import symplectic
from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry.conserved import (
    ORACLES,
    apply_flow,
    flow_matrices,
    generator_from_params,
    oracle_generators,
    sample_weights,
)
from pyro_invariance.symmetry.ode_flow import NeuralConserved, NeuralFlow
from pyro_invariance.symmetry.priors import UNBOUNDED_PRIORS, unbounded_prior
from pyro_invariance.tasks import DYNAMICS
from pyro_invariance.validation import check_positive_float, check_positive_int, check_seed, check_trailing_shape
from pyro_invariance.weight_priors import normal_prior, scale_hyperprior

from ._particles import drop_data_dim, num_particles, plate_particle_shape, site_particle_shape
from .base import CatalogueModel

#: ``"quadratic"``: K conserved quantities C_k(x) = xᵀA_k x/2 + b_kᵀx with parameters η; ``"neural"``: K
#: learned non-quadratic C_k (an MLP plus a quadratic form, flows by RK4); oracles: fixed generators.
SYMMETRIES = ("none", "quadratic", "neural") + ORACLES
SAMPLINGS = ("cube", "ball", "grid")


@MODELS.register(
    "symmetrised-hnn", summary="Bayesian HNN symmetrised by learned conserved quantities (Noether's razor)"
)
class SymmetrisedHNN(CatalogueModel):
    """Bayesian Hamiltonian MLP averaged over the flows of (learned) quadratic conserved quantities.

    Args:
        state_dim: phase-space dimension M (even; x = (q, p)).
        hidden: hidden widths (reference: (200, 200) SHO and oscillators, (250, 250, 250) 3-body;
            default a reduced (64, 64)).
        elu_alpha: α of the ELU activation (reference 2).
        symmetry: ``"none"`` (HNN), ``"quadratic"`` (K quadratic conserved quantities with parameters
            η), ``"neural"`` (K learned non-quadratic conserved quantities, a tanh MLP plus a quadratic
            form each, their flows solved by RK4: :mod:`pyro_invariance.symmetry.ode_flow`) or an
            oracle ``"so2"`` / ``"un"`` / ``"se2"`` (fixed generators).
        conserved_hidden: hidden widths of each learned C_k (``symmetry="neural"``; default (32, 32)).
        flow_steps: RK4 steps of each symmetry flow to τ = π (``symmetry="neural"``; default 8). For
            ``"neural"`` train with a small ``eta_lr`` (0.01 in ``benchmarks/kepler_noether.py``; at
            ``fit``'s default 0.1 the learned C's size grows by half in three steps on Kepler).
        learn_symmetry: learn η (``symmetry="quadratic"``; ``fit`` trains it with ``eta_lr``) or keep
            it at its random start. Oracles and ``"none"`` have no η.
        symmetry_prior: ``None`` (η a point estimate) or ``"normal"`` (``symmetry="quadratic"`` only):
            η = (W, b) become the latent sites ``"eta_W"`` ``(K, M, M)`` and ``"eta_b"`` ``(K, M)``
            with N(0, 1) entries (:mod:`pyro_invariance.symmetry.priors`). The prior and the
            likelihood are unchanged by flipping the sign of a quantity or rotating the span of the
            K quantities, so q(η) can sit at any of these equivalent modes: compare spans of the
            generators (principal angles), not coordinates.
        num_generators: K conserved quantities (reference 1 SHO, 30 oscillators, 10 3-body).
        num_transforms: S symmetry samples per forward pass (reference 200 SHO, 100 others; default 16).
        sampling: ``"cube"`` (U[−1,1]^K), ``"ball"`` (unit ball) or ``"grid"`` (K = 1, evenly spaced).
            For large K prefer ``"ball"`` (‖w‖ ≤ 1; the cube's ‖w‖ ≈ √(K/3)) with a small η learning
            rate: on 3 oscillators (K = 30) the cube with eta_lr 0.02 let the generators grow
            hyperbolic parts and the flows blew up (benchmarks/noether_tables.py).
        euler_steps: E explicit-Euler sub-steps per data step (reference 20, 10 for 3-body; default 5).
        dt: time between a state and its target (must match the data).
        noise_scale: σ, standard deviation of the Gaussian likelihood (fixed, or the initial value if
            ``learn_noise``; default √0.001).
        learn_noise: learn σ² as a point estimate (``log_noise_var``).
        prior: ``"fixed"``, ``"closed-form"`` (updated by
            :func:`pyro_invariance.infer.prior_update.update_prior_variance`) or ``"hierarchical"``.
        prior_scale: (initial) prior standard deviation √v₀ of every weight matrix.
        eta_init_std: std of the small random initial η (η = 0 cannot learn under symmetric sampling).
        init_seed: seed for the initial η and biases.

    Shapes: ``forward(x (B, M), y (B, M))`` → predicted next states ``(B, M)``. ``forward`` checks
    shapes only; :meth:`prepare_inputs` (called once by ``fit`` / ``evaluate``) converts both to
    the model's dtype and rejects non-finite states.
    """

    def __init__(
        self,
        state_dim: int = 2,
        hidden: Sequence[int] = (64, 64),
        elu_alpha: float = 2.0,
        symmetry: str = "quadratic",
        learn_symmetry: bool = True,
        num_generators: int = 1,
        num_transforms: int = 16,
        sampling: str = "cube",
        euler_steps: int = 5,
        dt: float = 0.2,
        noise_scale: float = 1e-3**0.5,
        learn_noise: bool = False,
        prior: str = "fixed",
        prior_scale: float = 1.0,
        eta_init_std: float = 0.01,
        init_seed: int = 0,
        symmetry_prior: str | None = None,
        conserved_hidden: Sequence[int] = (32, 32),
        flow_steps: int = 8,
    ) -> None:
        super().__init__()
        self.symmetry_prior = self.check_symmetry_prior(symmetry_prior, learn_symmetry)
        self.check_prior(prior)
        hidden = _checked_settings(
            state_dim, hidden, symmetry, sampling, num_generators, num_transforms, euler_steps, flow_steps,
            {"elu_alpha": elu_alpha, "dt": dt, "noise_scale": noise_scale, "prior_scale": prior_scale},
            eta_init_std, self.symmetry_prior,
        )  # fmt: skip
        self.state_dim, self.hidden, self.elu_alpha = int(state_dim), hidden, float(elu_alpha)
        self.symmetry, self.sampling, self.prior = symmetry, sampling, prior
        self.learn_symmetry = bool(learn_symmetry)
        self.num_transforms, self.euler_steps, self.dt = int(num_transforms), int(euler_steps), float(dt)
        gen = torch.Generator().manual_seed(check_seed(init_seed, "init_seed"))

        self._build_symmetry(num_generators, eta_init_std, conserved_hidden, flow_steps, gen)
        if sampling == "grid" and self.num_generators != 1 and symmetry != "none":
            raise ValueError("sampling='grid' needs exactly one generator")

        self._build_network(prior_scale)
        self.learn_noise = bool(learn_noise)
        log_noise_var = torch.tensor(2.0 * math.log(noise_scale))
        if learn_noise:
            self.log_noise_var = nn.Parameter(log_noise_var)
        else:
            self.register_buffer("log_noise_var", log_noise_var)

    def _build_symmetry(
        self, num_generators: int, eta_init_std: float, conserved_hidden: Sequence[int], flow_steps: int, gen: Any
    ) -> None:
        """The symmetry's parameters: learned generators η (K generators, (K, m, m) and (K, m); parameters, buffers,
        or latent sites under ``symmetry_prior``), a neural conserved-quantity network, or an oracle's generators."""
        symmetry, m = self.symmetry, self.state_dim
        if symmetry == "quadratic":
            k = self._num_generators = int(num_generators)
            eta_W = eta_init_std * torch.randn(k, m, m, generator=gen)
            eta_b = eta_init_std * torch.randn(k, m, generator=gen)
            if self.symmetry_prior is not None:
                # the guide's q(η) starts at the same small random η as a point estimate (guide_defaults)
                self.register_buffer("eta_W_init", eta_W, persistent=False)
                self.register_buffer("eta_b_init", eta_b, persistent=False)
                self.eta_W = PyroSample(lambda mod: unbounded_prior(mod.symmetry_prior, (k, m, m), mod.prior_var))
                self.eta_b = PyroSample(lambda mod: unbounded_prior(mod.symmetry_prior, (k, m), mod.prior_var))
            elif self.learn_symmetry:
                self.eta_W, self.eta_b = nn.Parameter(eta_W), nn.Parameter(eta_b)
            else:
                self.register_buffer("eta_W", eta_W)
                self.register_buffer("eta_b", eta_b)
        elif symmetry == "neural":
            self._num_generators = int(num_generators)
            self.flow_steps = int(flow_steps)
            self.conserved = NeuralConserved(
                m,
                self._num_generators,
                conserved_hidden,
                quadratic=True,
                init_std=max(eta_init_std, 1e-3),
                generator=gen,
            )
            if not self.learn_symmetry:
                self.conserved.requires_grad_(False)
        elif symmetry in ORACLES:
            self.register_buffer("oracle", oracle_generators(symmetry, m))

    def _build_network(self, prior_scale: float) -> None:
        """The Hamiltonian network's sites: input scale and biases (point estimates), weights w_l ~ N(0, v_l) with
        v_l from the ``prior_var`` buffer (or √v_l ~ LogNormal(log √v₀, 1) under ``prior="hierarchical"``)."""
        prior, m, hidden = self.prior, self.state_dim, self.hidden
        sizes = (m,) + hidden + (1,)
        self.num_layers = len(sizes) - 1
        self.input_scale = nn.Parameter(torch.tensor(1.0))
        for i in range(self.num_layers - 1):
            setattr(self, f"bias_{i}", nn.Parameter(torch.zeros(sizes[i + 1])))
        self.register_buffer("prior_var", torch.full((self.num_layers,), float(prior_scale) ** 2))
        for i in range(self.num_layers):
            if prior == "hierarchical":  # √v_l ~ LogNormal(log √v₀, 1), read from the buffer at each call
                setattr(
                    self,
                    f"prior_scale_{i}",
                    PyroSample(lambda mod, i=i: scale_hyperprior(0.5 * mod.prior_var[i].log())),
                )
            # normal_prior: a hierarchical scale is batched over vectorised particles, (P, 1)
            setattr(
                self,
                f"weight_{i}",
                PyroSample(
                    lambda mod, i=i, shape=(sizes[i + 1], sizes[i]): normal_prior(mod.layer_prior_scale(i), shape)
                ),
            )

    task = DYNAMICS
    priors = ("fixed", "closed-form", "hierarchical")
    symmetry_priors = UNBOUNDED_PRIORS
    #: ``forward`` evaluates vectorised ELBO particles in one pass: every Euler sub-step is one
    #: ``autograd.grad`` over all particles, symmetry samples and rows (``_particle_step``).
    vectorizable_particles = True

    # ------------------------------------------------------------------------------------
    @property
    def num_generators(self) -> int:
        if self.symmetry in ("quadratic", "neural"):
            return self._num_generators
        if self.symmetry in ORACLES:
            return self.oracle.shape[0]
        return 0

    @property
    def noise_var(self) -> Tensor:
        return self.log_noise_var.exp()

    def layer_prior_scale(self, i: int) -> Tensor:
        """Prior standard deviation of ``weight_i`` (a sample of ``prior_scale_i`` if hierarchical)."""
        if self.prior == "hierarchical":
            return getattr(self, f"prior_scale_{i}")
        return self.prior_var[i].sqrt()

    def weight_site_names(self) -> list[str]:
        return [f"weight_{i}" for i in range(self.num_layers)]

    def generators(self) -> Tensor:
        """Current generators ``(K, M+1, M+1)`` (quadratic: from η; oracle: fixed; none: empty). A
        ``"neural"`` model has no generator matrices: its C are functions (``self.conserved``)."""
        if self.symmetry == "neural":
            raise ValueError(
                "symmetry='neural' has no generator matrices: its conserved quantities are the functions "
                "model.conserved(x) (K values per state); analyse them on states instead"
            )
        if self.symmetry == "quadratic":
            return generator_from_params(self.eta_W, self.eta_b)
        if self.symmetry in ORACLES:
            return self.oracle
        m = self.state_dim + 1
        return self.input_scale.new_zeros(0, m, m)

    def symmetry_parameters(self) -> list[nn.Parameter]:
        """``[eta_W, eta_b]`` (the K quadratic conserved quantities) when they are learned as point
        estimates; ``[]`` when fixed or latent."""
        if self.symmetry == "neural":
            return list(self.conserved.parameters()) if self.learn_symmetry else []
        learned = self.symmetry == "quadratic" and self.learn_symmetry and self.symmetry_prior is None
        return [self.eta_W, self.eta_b] if learned else []

    def guide_defaults(self, guide_name: str) -> dict[str, Any]:
        """A latent η: q(η) starts at the model's small random η (``eta_init_std``) and every guide
        coordinate at standard deviation 0.01 — at 1.0 (the guides' default before Pyro's 0.1) the
        sampled generators' flows ``expm(πΣ w G)`` overflow (−ELBO/N ≈ 10⁸ on the SHO in 3 steps).
        Point estimates: none (the guides' 0.1; measured against 1.0 on the SHO, mean-field and
        block-Cholesky, seed 0: −ELBO/N −0.80 and 0.86 against 1.36 and 1.10, lower energy drift)."""
        if self.symmetry_prior is None:
            return {}
        inits = {"eta_W": self.eta_W_init, "eta_b": self.eta_b_init}

        def init_loc_fn(site: dict) -> Tensor:
            return inits[site["name"]].clone() if site["name"] in inits else init_to_feasible(site)

        return {"init_loc_fn": init_loc_fn, **({} if guide_name == "map" else {"init_scale": 0.01})}

    def symmetry_sites(self) -> list[str]:
        """``["eta_W", "eta_b"]`` when η is latent."""
        return ["eta_W", "eta_b"] if self.symmetry_prior is not None else []

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Frobenius norm of each generator ``G_k`` of η (the amount of symmetry), detached; a latent η
        from ``sites["eta_W"]``, ``sites["eta_b"]`` (``{}`` without)."""
        if self.symmetry == "neural":
            norms = self.conserved.quantity_norms()
            return {f"C{k}": norms[k] for k in range(norms.shape[0])}
        if self.symmetry != "quadratic":
            return {}
        if self.symmetry_prior is not None:
            if sites is None:
                return {}
            gens = generator_from_params(sites["eta_W"].detach(), sites["eta_b"].detach())
        else:
            gens = self.generators().detach()
        norms = gens.flatten(1).norm(dim=1)
        return {f"G{k}": norms[k] for k in range(norms.shape[0])}

    def sample_flows(self, num_transforms: int | None = None) -> Tensor | NeuralFlow | None:
        """S flow matrices ``(S, M+1, M+1)``, or for ``symmetry="neural"`` the S ODE flows
        (:class:`~pyro_invariance.symmetry.ode_flow.NeuralFlow`); None for ``symmetry="none"``."""
        if self.symmetry == "none":
            return None
        s = num_transforms or self.num_transforms
        if self.symmetry == "neural":
            return NeuralFlow(self.conserved, self._combination_weights(1, s)[0], steps=self.flow_steps)
        return flow_matrices(self.generators(), self._combination_weights(1, s)[0])

    def _combination_weights(self, n: int, s: int) -> Tensor:
        """Combination weights ``w (n, S, K)`` of ``n`` particles: ``n·S`` rows in one draw, particle-major
        (particle i gets the rows a sequential particle would draw i-th), or the grid for every particle."""
        k = self.num_generators
        ref = next(self.conserved.parameters()) if self.symmetry == "neural" else self.input_scale
        if self.sampling == "grid":
            return sample_weights(s, k, self.sampling, dtype=ref.dtype, device=ref.device).expand(n, s, k)
        return sample_weights(n * s, k, self.sampling, dtype=ref.dtype, device=ref.device).reshape(n, s, k)

    # ------------------------------------------------------------------------------------
    def observable(self, x: Tensor, weights: Sequence[Tensor]) -> Tensor:
        """The MLP ``f(x)``: ``(..., M)`` → ``(...)``."""
        h = x
        for i, w in enumerate(weights):
            h = h @ w.T / math.sqrt(w.shape[1])
            if i == 0:
                h = h * self.input_scale
            if i < self.num_layers - 1:
                h = F.elu(h + getattr(self, f"bias_{i}"), alpha=self.elu_alpha)
        return h.squeeze(-1)

    def hamiltonian(self, x: Tensor, weights: Sequence[Tensor], flows: Tensor | NeuralFlow | None) -> Tensor:
        """``H̄(x) = (1/S) Σ_s f(Φ_s(x))`` (or ``f(x)`` without flows): ``(B, M)`` → ``(B,)``."""
        if flows is None:
            return self.observable(x, weights)
        z = flows(x) if isinstance(flows, NeuralFlow) else apply_flow(x, flows)
        return self.observable(z, weights).mean(0)

    def vector_field(
        self, x: Tensor, weights: Sequence[Tensor], flows: Tensor | NeuralFlow | None, create_graph: bool
    ) -> Tensor:
        """``J∇H̄(x)`` by autograd, shape ``(B, M)``."""
        with torch.enable_grad():
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.hamiltonian(x, weights, flows).sum(), x, create_graph=create_graph)
        return symplectic(grad)

    def step(self, x: Tensor, weights: Sequence[Tensor], flows: Tensor | NeuralFlow | None) -> Tensor:
        """One data step: E explicit-Euler sub-steps of size dt/E, reusing ``flows``."""
        create_graph = torch.is_grad_enabled()
        h = self.dt / self.euler_steps
        for _ in range(self.euler_steps):
            v = self.vector_field(x, weights, flows, create_graph)
            x = x + h * v if create_graph else (x + h * v).detach()
        return x

    def sampled_weights(self) -> list[Tensor]:
        """The weight matrices of this forward pass (samples of the ``weight_i`` sites)."""
        return [getattr(self, f"weight_{i}") for i in range(self.num_layers)]

    def input_shapes(self) -> list[tuple[int, ...]]:
        """``x`` rows are states ``(M,)`` = (q, p)."""
        return [(self.state_dim,)]

    def target_shapes(self) -> list[tuple[int, ...]]:
        """``y`` rows are next states ``(M,)``."""
        return [(self.state_dim,)]

    def check_states(self, name: str, x: Tensor) -> None:
        """``x`` must have shape ``(B, M)`` (no value is read)."""
        check_trailing_shape(name, x, self.input_shapes())

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Pyro model: predicted next states ``(B, M)``; observes ``y`` in plate "data" scaled to ``num_data``."""
        self.check_states("x", x)
        if y is not None:
            self.check_states("y", y)
            if y.shape[0] != x.shape[0]:
                raise ValueError(f"y has {y.shape[0]} rows, x has {x.shape[0]}")
        weights = self.sampled_weights()
        particles = plate_particle_shape()
        for w in weights:
            particles = torch.broadcast_shapes(particles, site_particle_shape(w, 2))
        if particles:  # vectorised particles: (*P, B, M)
            pred = self._particle_step(x, weights, particles)
        else:
            pred = self.step(x, weights, self.sample_flows())
        self.observe(dist.Normal(pred, self.noise_var.sqrt()).to_event(1), y, x, num_data)
        return pred

    # -- vectorised particles ------------------------------------------------------------------
    # Under a particle plate (``vectorize_particles=True``) the weight sites have shape
    # (*P, 1, out, in) and a latent η (*P, 1, K, ...). The particles are flattened to n = prod(P);
    # each gets its own weights, its own flows (own combination weights w_s unless
    # sampling="grid"; own generators when η is latent) and its own trajectory, and every Euler
    # sub-step is one autograd.grad over (n, S, B): the same numbers as n sequential particles.

    def _particle_flows(self, particles: torch.Size) -> Tensor | None:
        """Flow matrices of ``n`` particles ``(n, S, M+1, M+1)``, or ``(S, M+1, M+1)`` shared by all
        (grid sampling with point-estimate or oracle generators), or ``None`` (``symmetry="none"``).
        Random combination weights: :meth:`_combination_weights`; ``symmetry="neural"``: the ODE flows
        of every particle's combinations of the same learned C."""
        if self.symmetry == "none":
            return None
        n, s = num_particles(particles), self.num_transforms
        if self.symmetry == "neural":
            return NeuralFlow(self.conserved, self._combination_weights(n, s), steps=self.flow_steps)
        g = self.generators()  # (K, D, D) or latent (*P, 1, K, D, D)
        if g.dim() == 3 and self.sampling == "grid":
            return flow_matrices(g, self._combination_weights(1, s)[0])
        w = self._combination_weights(n, s)
        g = drop_data_dim(g, 3).expand(*particles, *g.shape[-3:]).reshape(n, *g.shape[-3:])
        return torch.linalg.matrix_exp(torch.pi * torch.einsum("nsk,nkij->nsij", w, g))

    def _particle_observable(self, z: Tensor, weights: Sequence[Tensor]) -> Tensor:
        """The MLP ``f`` of each particle: ``z`` ``(n, R, M)`` (R rows), ``weights`` ``(n, in, out)``
        (:meth:`_particle_layers`: transposed and scaled) → ``(n, R)``."""
        h = z
        for i, w in enumerate(weights):
            h = torch.baddbmm(getattr(self, f"bias_{i}"), h, w) if i < self.num_layers - 1 else h @ w
            if i < self.num_layers - 1:
                h = F.elu(h, alpha=self.elu_alpha)
        return h.squeeze(-1)

    def _particle_layers(self, weights: Sequence[Tensor]) -> list[Tensor]:
        """The layer matrices of :meth:`observable` as ``(n, in, out)`` factors, ``Wᵀ/√in`` (times
        ``input_scale`` for the first layer): scaling the small weight matrices once instead of the
        ``(n, S·B, width)`` activations at every Euler sub-step (the same function, rounded differently)."""
        out = []
        for i, w in enumerate(weights):
            scale = self.input_scale / math.sqrt(w.shape[-1]) if i == 0 else 1.0 / math.sqrt(w.shape[-1])
            out.append(w.transpose(-1, -2) * scale)
        return out

    def _particle_hamiltonian(self, x: Tensor, weights: Sequence[Tensor], flows: Tensor | NeuralFlow | None) -> Tensor:
        """``H̄`` of each particle: ``x`` ``(n, B, M)`` → ``(n, B)``, averaged over the S flows."""
        if flows is None:
            return self._particle_observable(x, weights)
        n, b, m = x.shape
        if isinstance(flows, NeuralFlow):
            z = flows(x)  # (n, S, B, M)
        elif flows.dim() == 3:  # shared (S, D, D)
            z = torch.einsum("sij,nbj->nsbi", flows[..., :m, :m], x) + flows[None, :, None, :m, m]
        else:
            z = torch.einsum("nsij,nbj->nsbi", flows[..., :m, :m], x) + flows[..., :m, m].unsqueeze(-2)
        s = z.shape[1]
        return self._particle_observable(z.reshape(n, s * b, m), weights).reshape(n, s, b).mean(1)

    def _particle_vector_field(
        self, x: Tensor, weights: Sequence[Tensor], flows: Tensor | NeuralFlow | None, create_graph: bool
    ) -> Tensor:
        """``J∇H̄`` of each particle, ``(n, B, M)``: one ``autograd.grad`` for all particles and flows."""
        with torch.enable_grad():
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            h = self._particle_hamiltonian(x, weights, flows)
            (grad,) = torch.autograd.grad(h.sum(), x, create_graph=create_graph)
        return symplectic(grad)

    def _particle_step(self, x: Tensor, weights: Sequence[Tensor], particles: torch.Size) -> Tensor:
        """:meth:`step` for every particle at once: ``x`` ``(B, M)`` → ``(*particles, B, M)``."""
        n = num_particles(particles)
        ws = []
        for w in weights:
            shape = w.shape[-2:]
            ws.append(drop_data_dim(w, 2).expand(*particles, *shape).reshape(n, *shape))
        ws = self._particle_layers(ws)
        flows = self._particle_flows(particles)
        xs = x.expand(n, *x.shape)
        create_graph = torch.is_grad_enabled()
        h = self.dt / self.euler_steps
        for _ in range(self.euler_steps):
            v = self._particle_vector_field(xs, ws, flows, create_graph)
            xs = xs + h * v if create_graph else (xs + h * v).detach()
        return xs.reshape(*particles, *x.shape)


def _checked_settings(
    state_dim: int,
    hidden: Sequence[int],
    symmetry: str,
    sampling: str,
    num_generators: int,
    num_transforms: int,
    euler_steps: int,
    flow_steps: int,
    positive: dict[str, float],
    eta_init_std: float,
    symmetry_prior: str | None,
) -> tuple[int, ...]:
    """:class:`SymmetrisedHNN`'s arguments checked (one-line errors); returns ``hidden`` as a tuple of widths."""
    if symmetry_prior is not None and symmetry != "quadratic":
        raise ValueError(f"symmetry_prior needs symmetry='quadratic' (learned generators), got {symmetry!r}")
    check_positive_int("state_dim", state_dim, minimum=2)
    if state_dim % 2:
        raise ValueError(f"state_dim must be even (x = (q, p)), got {state_dim}")
    hidden = tuple(int(h) for h in hidden)
    if not hidden or min(hidden) < 1:
        raise ValueError(f"hidden must be a non-empty list of positive widths, got {hidden}")
    if symmetry not in SYMMETRIES:
        raise ValueError(f"unknown symmetry {symmetry!r}; use one of {SYMMETRIES}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; use one of {SAMPLINGS}")
    check_positive_int("num_generators", num_generators)
    check_positive_int("num_transforms", num_transforms)
    check_positive_int("euler_steps", euler_steps)
    check_positive_int("flow_steps", flow_steps)
    for name, value in positive.items():
        check_positive_float(name, value)
    if not (eta_init_std >= 0 and math.isfinite(eta_init_std)):
        raise ValueError(f"eta_init_std must be >= 0, got {eta_init_std}")
    return hidden
