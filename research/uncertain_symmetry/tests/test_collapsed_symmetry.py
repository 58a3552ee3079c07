"""The collapsed q(η) (:mod:`research.uncertain_symmetry.collapsed_symmetry`) — q* ∝ p(η) exp(IWAE_K(η)) of a
fitted q(θ | η) by quadrature — its grid density
(:class:`~research.uncertain_symmetry.distributions.PiecewiseLinear`), the common random numbers of the
profile, and q* against the exact p(λ | D) of basis regression."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import exact_symmetry_posterior, grid_posterior  # noqa: E402
from research.uncertain_symmetry.collapsed_symmetry import (  # noqa: E402
    CollapsedSymmetryGuide,
    collapse_symmetry,
    default_symmetry_grid,
    profile_noise,
)
from research.uncertain_symmetry.distributions import PiecewiseLinear  # noqa: E402
from research.uncertain_symmetry.evidence_profile import guide_evidence_profile  # noqa: E402
from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional  # noqa: E402
from research.uncertain_symmetry.tests.helpers import basis_lambda_conditional  # noqa: E402

WIDE = math.pi / math.sqrt(3.0)


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


# ------------------------------------------------------------------------------------------------
# the grid density


def _bumpy() -> tuple[torch.Tensor, torch.Tensor]:
    grid = torch.cat([torch.linspace(0.0, 1.0, 7), torch.linspace(1.05, 3.0, 30)]).double()  # uneven spacing
    density = torch.exp(-((grid - 1.0) ** 2) / 0.1) + 0.2 * (grid > 2.0).double()
    return grid, density * 3.7  # any scale


def test_piecewise_linear_is_the_grid_posteriors_density_moments_and_cdf() -> None:
    grid, density = _bumpy()
    d = PiecewiseLinear(grid, density)
    gp = grid_posterior(grid, density.log(), torch.zeros_like(grid))  # the same normalised density
    fine, _ = torch.sort(torch.cat([torch.linspace(-0.5, 3.5, 4001, dtype=torch.float64), grid]))
    p = d.log_prob(fine).exp()
    inside = (fine >= grid[0]) & (fine <= grid[-1])  # the trapezoidal rule is exact on a linear density
    assert torch.trapezoid(p[inside], fine[inside]).item() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(p.numpy(), np.interp(fine.numpy(), gp.grid, gp.density, left=0.0, right=0.0), atol=1e-12)
    assert d.mean.item() == pytest.approx(gp.mean, rel=1e-12)
    assert d.variance.sqrt().item() == pytest.approx(gp.sd, rel=1e-12)
    assert torch.allclose(d.cdf(grid), torch.as_tensor(gp.cumulative()), atol=1e-12)  # at the grid points
    for v in (0.3, 1.02, 2.5):  # inside a cell: the exact (quadratic) CDF, not GridPosterior's linear interpolation
        below = fine[inside & (fine <= v)]
        head = torch.cat([below, torch.tensor([v], dtype=torch.float64)])
        assert d.cdf(torch.tensor(v, dtype=torch.float64)).item() == pytest.approx(
            torch.trapezoid(d.log_prob(head).exp(), head).item(), abs=1e-7
        )
    assert d.log_prob(torch.tensor([-0.1, 3.1], dtype=torch.float64)).isneginf().all()


def test_piecewise_linear_draws_follow_its_cdf_and_are_a_reparameterisation() -> None:
    grid, density = _bumpy()
    d = PiecewiseLinear(grid, density)
    torch.manual_seed(0)
    x = d.sample((100_000,))
    assert ((x >= grid[0]) & (x <= grid[-1])).all()
    # Kolmogorov distance of 10⁵ exact draws: ≈ 0.87/√n at its median, < 1.63/√n with probability 0.99
    s, _ = torch.sort(x)
    cdf = d.cdf(s)
    n = s.numel()
    ks = max((torch.arange(1, n + 1) / n - cdf).max().item(), (cdf - torch.arange(n) / n).max().item())
    assert ks < 1.63 / math.sqrt(n)
    # the inverse CDF: F(x(u)) = u, and x is differentiable in the density
    dens = density.clone().requires_grad_(True)
    torch.manual_seed(1)
    r = PiecewiseLinear(grid, dens).rsample((64,))
    torch.manual_seed(1)
    u = torch.rand(64, dtype=torch.float64)
    assert torch.allclose(PiecewiseLinear(grid, density).cdf(r.detach()), u, atol=1e-10)
    r.sum().backward()
    assert dens.grad is not None and torch.isfinite(dens.grad).all() and dens.grad.abs().sum() > 0


def test_piecewise_linear_refuses_bad_grids_in_one_line() -> None:
    g = torch.linspace(0, 1, 5)
    for grid, density, match in [
        (g.flip(0), torch.ones(5), "strictly increasing"),
        (g, -torch.ones(5), "non-negative"),
        (g, torch.zeros(5), "not all 0"),
        (g, torch.ones(4), "one length"),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            PiecewiseLinear(grid, density)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------
# basis regression with λ latent: the profile's common random numbers and the collapse


_basis = basis_lambda_conditional


def _perturbed(guide) -> None:
    """A guide whose q(θ | λ) depends on λ (B ≠ 0) and whose q(λ) is not at its start."""
    with torch.no_grad():
        torch.manual_seed(3)
        for p in guide.parameters():
            p.add_(0.1 * torch.randn_like(p))


def test_common_noise_makes_each_profile_point_the_one_a_grid_of_that_point_alone_gives() -> None:
    model, guide, x, y = _basis()
    _perturbed(guide)
    grid = [0.4, 0.9, 1.3]
    common = guide_evidence_profile(model, guide, x, y, grid, K=16, seed=5, common_noise=True)
    for j, lam in enumerate(grid):
        alone = guide_evidence_profile(model, guide, x, y, [lam], K=16, seed=5, common_noise=True)
        assert alone.item() == common[j].item()
    fresh = guide_evidence_profile(model, guide, x, y, grid, K=16, seed=5)
    assert (fresh != common).all()  # the default draws one stream through the grid


def test_collapse_is_the_grid_posterior_of_the_common_noise_profile_and_a_guide_for_the_model() -> None:
    model, guide, x, y = _basis()
    _perturbed(guide)
    collapsed = collapse_symmetry(model, guide, x, y, num_points=41, K=8, seed=2)
    prior = poutine.trace(model).get_trace(x[:1], y[:1], num_data=x.shape[0]).nodes["lam"]["fn"]
    grid = default_symmetry_grid(prior.support, 41)
    assert np.allclose(grid.numpy()[[0, -1]], [2e-3, 2 - 2e-3], atol=1e-12)  # λ ∈ (0, 2): 10⁻³ of the width inside
    assert np.allclose(collapsed.posterior.grid, grid.numpy(), atol=1e-12)
    profile = guide_evidence_profile(model, guide, x, y, grid.float(), K=8, seed=2, common_noise=True)
    log_prior = prior.log_prob(grid.float().reshape(-1, *prior.batch_shape, *prior.event_shape)).reshape(41, -1).sum(-1)
    expected = grid_posterior(grid, profile, log_prior.double())
    assert np.allclose(collapsed.posterior.density, expected.density, rtol=1e-10)
    assert collapsed.posterior.log_marginal == pytest.approx(expected.log_marginal, rel=1e-12)
    # a guide: λ from q*, the weights from the fitted guide's q(θ | λ) at that λ
    torch.manual_seed(0)
    lams = (
        torch.stack(
            [poutine.trace(collapsed).get_trace(x, y, num_data=x.shape[0]).nodes["lam"]["value"] for _ in range(4000)]
        )
        .double()
        .ravel()
    )
    post = collapsed.posterior
    assert abs(lams.mean().item() - post.mean) < 4 * post.sd / math.sqrt(4000)
    torch.manual_seed(1)
    tr = poutine.trace(collapsed).get_trace(x, y, num_data=x.shape[0])
    lam = tr.nodes["lam"]["value"]
    held = guide.symmetry_condition("lam", lam)
    aux = {name: tr.nodes[name]["value"] for name in tr.nodes if name.endswith("_aux")}
    direct = poutine.trace(poutine.condition(guide, data={**held, **aux})).get_trace(x, y, num_data=x.shape[0])
    assert torch.equal(direct.nodes["weight"]["value"], tr.nodes["weight"]["value"])
    assert "lam_aux" not in tr.nodes  # q(λ)'s own noise is replaced by q*
    assert torch.isfinite(torch.tensor(list(pi.evaluate((model, collapsed), (x, y), num_samples=4).values()))).all()
    with pytest.raises(ValueError, match="one η per call") as err:  # refused, not silently mis-shaped
        pyro.infer.Trace_ELBO(num_particles=2, vectorize_particles=True, max_plate_nesting=1).loss(
            model, collapsed, x, y, num_data=x.shape[0]
        )
    assert "vectorize_particles=False" in str(err.value).splitlines()[0]  # ours; Pyro appends the trace's shapes


def test_streams_average_single_stream_profiles_and_report_their_shape_noise() -> None:
    model, guide, x, y = _basis()
    _perturbed(guide)
    three = collapse_symmetry(model, guide, x, y, num_points=21, K=4, streams=3, seed=7)
    singles = [collapse_symmetry(model, guide, x, y, num_points=21, K=4, seed=7 + r) for r in range(3)]
    assert singles[0].profile_noise is None
    each = torch.stack([c.profile for c in singles])
    assert torch.equal(three.stream_profiles.double(), each)
    assert np.allclose(three.posterior.log_evidence, each.mean(0).numpy(), rtol=0, atol=1e-12)
    # the pooled shape noise, by hand: deviations from the mean profile, each less its mean over the points
    # where q* has mass, pooled, one stream's (× √(R/(R−1))), then the mean's (÷ √R)
    dens = torch.as_tensor(three.posterior.density)
    where = dens >= 1e-3 * dens.max()
    dev = (each - each.mean(0))[:, where]
    dev = dev - dev.mean(1, keepdim=True)
    expected = math.sqrt(float((dev**2).sum()) / (dev.numel() * 2 / 3)) / math.sqrt(3)
    assert three.profile_noise == pytest.approx(expected, rel=1e-12)
    # an offset shared by every η is not shape noise
    shifted = each + torch.tensor([[0.0], [5.0], [-3.0]], dtype=torch.float64)
    assert profile_noise(shifted, dens) == pytest.approx(three.profile_noise, rel=1e-9)


def test_blocks_are_the_pooled_draws_split_into_streams() -> None:
    """``blocks=R``: R·K particles at each point in one pass; logsumexp over the blocks less log R is the IWAE_{RK}
    of the same draws, i.e. the K·R-particle profile with the same seed (basis regression: sequential particles;
    the invariant MLP: vectorised)."""
    model, guide, x, y = _basis()
    _perturbed(guide)
    grid = [0.4, 0.9, 1.3]
    blocks = guide_evidence_profile(model, guide, x, y, grid, K=4, seed=5, common_noise=True, blocks=3)
    pooled = guide_evidence_profile(model, guide, x, y, grid, K=12, seed=5, common_noise=True)
    assert blocks.shape == (3, 3) and blocks.dtype == torch.float64
    assert torch.allclose(torch.logsumexp(blocks, 0) - math.log(3), pooled, rtol=1e-6, atol=0)  # float32 weights
    assert (blocks[0] != blocks[1]).all()  # independent blocks
    mlp = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=8, num_transforms=2, symmetry_prior="uniform")
    assert mlp.vectorizable_particles
    q = guides.get("symmetry-conditional", mlp)
    torch.manual_seed(0)
    xi, yi = torch.rand(12, 1, 8, 8), torch.randint(0, 10, (12,))
    etas = [0.3, 2.0]
    blocks = guide_evidence_profile(mlp, q, xi, yi, etas, K=5, seed=1, common_noise=True, blocks=4)
    pooled = guide_evidence_profile(mlp, q, xi, yi, etas, K=20, seed=1, common_noise=True)
    assert blocks.shape == (4, 2)
    assert torch.allclose(torch.logsumexp(blocks, 0) - math.log(4), pooled, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="blocks must be >= 1") as err:
        guide_evidence_profile(model, guide, x, y, grid, K=4, blocks=0)
    assert "\n" not in str(err.value)


def test_stream_batch_draws_streams_as_blocks_of_one_pass() -> None:
    model, guide, x, y = _basis()
    _perturbed(guide)
    four = collapse_symmetry(model, guide, x, y, num_points=11, K=3, streams=4, stream_batch=2, seed=7)
    grid = four.posterior.grid
    each = torch.cat(
        [
            guide_evidence_profile(
                model, guide, x, y, torch.as_tensor(grid).float(), K=3, seed=7 + c, common_noise=True, blocks=2
            )
            for c in range(2)
        ]
    )
    assert torch.equal(four.stream_profiles, each)
    assert np.allclose(four.posterior.log_evidence, each.mean(0).numpy(), rtol=0, atol=1e-12)
    assert four.profile_noise is not None and four.profile_noise > 0
    with pytest.raises(ValueError, match="divide streams") as err:
        collapse_symmetry(model, guide, x, y, num_points=5, streams=4, stream_batch=3)
    assert "\n" not in str(err.value)


def test_collapse_refusals_are_one_line() -> None:
    model, guide, x, y = _basis()
    fixed, fx, fy = entry("basis-regression").build()  # λ a point estimate
    cases = [
        (
            lambda: collapse_symmetry(fixed, guides.get("mean-field", fixed), fx, fy, num_points=5),
            "one latent symmetry site",
        ),
        (lambda: collapse_symmetry(model, object(), x, y, num_points=5), "catalogue guide"),
        (lambda: collapse_symmetry(model, guide, x, y, grid=[0.5, 2.5]), "not strictly inside"),
        (lambda: collapse_symmetry(model, guide, x, y, num_points=2), "num_points"),
        (lambda: collapse_symmetry(model, guide, x, y, num_points=5, streams=0), "streams"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)


# q* against the exact p(λ | D) (the accuracy criterion for q(λ)). Settings fixed before this test first ran:
# the symmetry-conditional guide with a full weight covariance (the exact p(θ | λ, D) is a correlated Gaussian),
# q(λ) started wide (π/√3 in u) and the library's warm-up (400 steps) then the joint fit of the full-rank tests
# (1500 steps, lr 0.05, full batch, 4 particles); the collapse at K = 100 on 201 points.
COLLAPSE_GUIDE = {"weight_covariance": "mvn", "symmetry_init_scale": WIDE}
COLLAPSE_FIT = {"steps": 1500, "lr": 0.05, "factor_lr": 0.05, "batch_size": None, "num_particles": 4}
COLLAPSE_WARMUP = {**COLLAPSE_FIT, "steps": 400}


@pytest.fixture(scope="module")
def exact_lambda():
    model, x, y = entry("basis-regression-lambda").build()
    return exact_symmetry_posterior(model, x, y)


@pytest.mark.parametrize("seed", (0, 1, 2))
def test_collapsed_q_lambda_meets_the_accuracy_criterion_against_the_exact_posterior(seed, exact_lambda) -> None:
    """The accuracy criterion, "q(λ) mean within 0.1·sd and sd within 25 % of the exact quadrature posterior",
    for the collapsed q*(λ) of a warmed-up symmetry-conditional fit. Measured
    (research/uncertain_symmetry/results/symmetry_posterior_basis.md, the same settings): sd ratios 0.864, 0.980,
    0.880 and mean errors −0.032, +0.034, −0.042 sd on seeds 0–2, where the same fits' Gaussian q(λ) has sd ratios
    0.54–0.58. On the held-out seeds 3–5, run after this test was written, the sd part holds (1.036, 0.967,
    0.967) but the mean part fails on two (+0.100, +0.118 sd; −0.022 holds). The exact posterior is symmetric
    about 1, so the error is the profile's; a shift of 0.1 sd needs a tilt of only ≈ 0.1 nats across one sd
    of λ, within reach of one stream of Monte-Carlo noise (not measured)."""
    model, guide, x, y = _basis(**COLLAPSE_GUIDE)
    warm_up_conditional(model, guide, (x, y), seed=seed, progress=False, **COLLAPSE_WARMUP)
    pi.fit(model, guide, (x, y), seed=seed, progress=False, **COLLAPSE_FIT)
    collapsed = collapse_symmetry(model, guide, x, y, num_points=201, K=100, seed=seed)
    post = collapsed.posterior
    assert abs(post.mean - exact_lambda.mean) < 0.1 * exact_lambda.sd, (post.mean, exact_lambda.mean)
    assert abs(post.sd / exact_lambda.sd - 1.0) < 0.25, (post.sd, exact_lambda.sd)
    assert isinstance(collapsed, CollapsedSymmetryGuide)
