"""Where the guides start (one ``init_scale`` default per guide, Pyro's 0.1, unless a catalogue model
says otherwise) and whether they reach a posterior they can represent under ``pi.fit``'s defaults.

The convergence model is the linear-Gaussian case of ``benchmarks/guide_convergence.py``: a bias-free
Bayesian linear regression with one ``1×5`` weight matrix, whose exact posterior the full-rank,
block-Cholesky and matrix-normal guides can all represent, so ``log Z − ELBO`` can reach 0.
"""

from __future__ import annotations

import inspect
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.guides import autoguides, block_cholesky, matrix_normal, symmetry_conditional
from pyro_invariance.guides.base import DEFAULT_INIT_SCALE, MeanFieldNormal
from pyro_invariance.infer.bounds import log_weights

torch.set_num_threads(1)

N, D = 100, 5
#: registered name -> (factory, class); ``map`` has no scale
WITH_SCALE = {
    "mean-field": (autoguides.mean_field, MeanFieldNormal),
    "full-rank": (autoguides.full_rank, autoguides.FullRankNormal),
    "low-rank": (autoguides.low_rank, autoguides.LowRankNormal),
    "block-cholesky": (block_cholesky.BlockCholeskyGuide, block_cholesky.BlockCholeskyGuide),
    "matrix-normal": (matrix_normal.MatrixNormalGuide, matrix_normal.MatrixNormalGuide),
    "symmetry-conditional": (symmetry_conditional.symmetry_conditional, symmetry_conditional.SymmetryConditional),
}


class BayesLinear(PyroModule):
    """``W ~ N(0, 1)`` of shape (1, D), ``y_n ~ N(x_nᵀ W₀, noise²)``: Pyro's style, plus ``num_data``."""

    def __init__(self, noise: float = 1.0) -> None:
        super().__init__()
        self.noise = noise
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, D]).to_event(2))

    def forward(self, x, y=None, num_data=None):
        mean = (x * self.weight[..., 0, :]).sum(-1)  # broadcasts over a batch of weight draws
        with pyro.plate("data", num_data or x.shape[0], subsample_size=x.shape[0]):
            return pyro.sample("obs", dist.Normal(mean, self.noise), obs=y)


def linear_data(noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmark's data: correlated inputs, so the posterior is correlated."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(N, D, generator=gen)
    x = z + 0.3 * z[:, :1]
    w = torch.randn(D, generator=gen)
    return x, x @ w + noise * torch.randn(N, generator=gen)


def log_evidence(x: torch.Tensor, y: torch.Tensor, noise: float = 1.0) -> float:
    x64, y64 = x.double(), y.double()
    cov = x64 @ x64.T + noise**2 * torch.eye(N, dtype=torch.float64)
    return float(dist.MultivariateNormal(torch.zeros(N, dtype=torch.float64), covariance_matrix=cov).log_prob(y64))


def gap_after_fit(name: str, steps: int, seed: int = 0) -> float:
    """``log Z − ELBO`` (nats) after ``pi.fit`` with its defaults and ``steps`` steps; ELBO from 4000 draws."""
    x, y = linear_data()
    model = BayesLinear()
    result = pi.fit(model, name, (x, y), steps=steps, seed=seed, progress=False)
    torch.manual_seed(1)
    lw, _ = log_weights(model, result.guide, x, y, 4000, vectorize=True, particle_chunk=4000)
    return log_evidence(x, y) - float(lw.mean())


# --------------------------------------------------------------------------------------------
# one default per guide


@pytest.mark.parametrize("name", list(WITH_SCALE))
def test_class_and_factory_share_one_default_init_scale(name):
    """The registry, the factory and the class all start at Pyro's 0.1 (the API page showed the class at
    0.1 beside the factory at 1.0)."""
    factory, cls = WITH_SCALE[name]
    model = BayesLinear()
    built = {"registry": guides.get(name, model), "factory": factory(model), "class": cls(model)}
    starts = {how: guide._init_scale for how, guide in built.items()}
    starts["factory signature"] = inspect.signature(factory).parameters["init_scale"].default
    assert starts == dict.fromkeys(starts, 0.1)
    assert DEFAULT_INIT_SCALE == 0.1


@pytest.mark.parametrize("name", ["mean-field", "block-cholesky", "matrix-normal", "full-rank"])
def test_guides_start_at_standard_deviation_0_1(name):
    x, y = linear_data()
    guide = guides.get(name, BayesLinear())
    guide(x, y)
    with torch.no_grad():
        if name == "full-rank":
            std = guide.get_posterior().stddev
        else:
            std = guide.get_distribution("weight").variance.sqrt()
    torch.testing.assert_close(std, torch.full_like(std, 0.1))


def test_models_that_keep_the_wide_start_say_so_in_guide_defaults():
    """The invariant MLP (the digits demo) and the 2-D rotation toy keep ``init_scale`` 1.0 (measured in
    their ``guide_defaults``); ``map`` takes no scale; basis regression takes the guides' default."""
    for model in (pi.models.get("invariant-mlp", hidden=8, num_transforms=2), pi.models.get("rotation-toy-2d")):
        for name in WITH_SCALE:
            assert model.guide_defaults(name).get("init_scale") == 1.0, (type(model).__name__, name)
        assert "init_scale" not in model.guide_defaults("map")
        assert guides.get("block-cholesky", model)._init_scale == 1.0
    basis = pi.models.get("basis-regression")
    assert "init_scale" not in basis.guide_defaults("block-cholesky")
    assert guides.get("block-cholesky", basis)._init_scale == DEFAULT_INIT_SCALE


# --------------------------------------------------------------------------------------------
# convergence on an exactly representable posterior


#: bounds on the gap after ``pi.fit``'s default 1000 steps (seed 0): from the old init_scale 1.0 the
#: gaps were 0.148 (full-rank), 0.301 (block-Cholesky) and 0.536 (matrix-normal); from 0.1 they are
#: 0.03, 0.15 and 0.16 (block-Cholesky and matrix-normal need about 4000 steps for 0.05 nats: their
#: unit-triangular factors train at the library's factor_lr, benchmarks/results/guide_convergence.md)
GAP_AFTER_1000 = {"full-rank": 0.08, "block-cholesky": 0.22, "matrix-normal": 0.22}


@pytest.mark.parametrize("name", list(GAP_AFTER_1000))
def test_structured_guides_approach_the_exact_posterior_in_fits_default_steps(name):
    gap = gap_after_fit(name, steps=1000)
    assert math.isfinite(gap) and -0.05 < gap < GAP_AFTER_1000[name], gap


@pytest.mark.slow
@pytest.mark.parametrize("name", ["full-rank", "block-cholesky", "matrix-normal"])
def test_structured_guides_reach_the_exact_posterior_within_0_05_nats(name):
    """The criterion of ``benchmarks/guide_convergence.py``: within 0.05 nats after 4000 steps of ``pi.fit``."""
    assert gap_after_fit(name, steps=4000) <= 0.05
