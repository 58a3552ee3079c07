"""Laplace ``log p(D | η)`` of an invariant MLP's read-out (``research.uncertain_symmetry.laplace_evidence``):
the curvature against a dense Kronecker sum and autograd, the mode's stationarity, the evidence against
importance sampling with many data (where Laplace is nearly exact) and against its own pieces, the posterior over a
latent η against fixed-η evidences and the model's prior, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior
from pyro_invariance.models import InvariantMLP
from pyro_invariance.symmetry.priors import bounded_prior
from research.uncertain_symmetry.annealed_evidence import readout_design
from research.uncertain_symmetry.laplace_evidence import (
    LaplaceSymmetryPosterior,
    _softmax_hessian,
    laplace_readout_evidence,
    laplace_readout_predictive,
    laplace_symmetry_posterior,
    laplace_symmetry_predictive,
    readout_log_evidence,
    readout_mode,
)
from research.uncertain_symmetry.tests.tiny_readout import (
    tiny_latent_model,
)
from research.uncertain_symmetry.tests.tiny_readout import (
    tiny_readout_data as _data,
)
from research.uncertain_symmetry.tests.tiny_readout import (
    tiny_readout_model as _tiny,
)


def _problem(n: int, m: int = 3, c: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A full-rank basis and labels drawn from a softmax regression on it."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(n, m, generator=g, dtype=torch.float64)
    w = torch.randn(m, c, generator=g, dtype=torch.float64)
    y = torch.distributions.Categorical(logits=basis @ w).sample()  # torch's RNG, seeded below
    return basis, torch.nn.functional.one_hot(y, c).double()


def _log_joint(basis: torch.Tensor, onehot: torch.Tensor, sigma: float, w: torch.Tensor) -> torch.Tensor:
    logits = basis @ w
    return (logits * onehot).sum() - torch.logsumexp(logits, -1).sum() - 0.5 * (w**2).sum() / sigma**2


def test_curvature_is_the_dense_kronecker_sum_and_the_autograd_hessian() -> None:
    torch.manual_seed(0)
    basis, onehot = _problem(30, m=4)
    probs = torch.softmax(torch.randn(30, 3, dtype=torch.float64), -1)
    dense = sum(torch.kron(torch.outer(b, b), torch.diag(p) - torch.outer(p, p)) for b, p in zip(basis, probs))
    assert torch.allclose(_softmax_hessian(basis, probs), dense, atol=1e-12)
    w = torch.randn(4, 3, dtype=torch.float64)
    auto = torch.autograd.functional.hessian(lambda v: -_log_joint(basis, onehot, 1e9, v.reshape(4, 3)), w.reshape(-1))
    assert torch.allclose(_softmax_hessian(basis, torch.softmax(basis @ w, -1)), auto, atol=1e-9)


def test_mode_is_stationary_and_the_factor_is_the_posterior_precision() -> None:
    torch.manual_seed(1)
    basis, onehot = _problem(40)
    w, ll, chol, steps = readout_mode(basis, onehot, sigma=2.0)
    v = w.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_log_joint(basis, onehot, 2.0, v), v)
    precision = _softmax_hessian(basis, torch.softmax(basis @ w, -1)) + torch.eye(9, dtype=torch.float64) / 4.0
    # the documented stop: Newton decrement gᵀΛ⁻¹g < 1e-8, i.e. the log joint within ~5e-9 nats of its maximum
    g = grad.reshape(-1)
    assert float(g @ torch.linalg.solve(precision, g)) < 1e-8 and steps >= 1
    assert torch.allclose(chol @ chol.T, precision, atol=1e-9)
    assert ll.item() == pytest.approx(float((basis @ w * onehot).sum() - torch.logsumexp(basis @ w, -1).sum()))


def test_evidence_matches_importance_sampling_when_the_posterior_is_nearly_gaussian() -> None:
    """2000 data, 9 weights: the posterior is close to its Laplace Gaussian, so importance sampling with that
    Gaussian as proposal (30k draws, in chunks) is exact to ~0.001 nats, and Laplace must agree to 0.05."""
    torch.manual_seed(2)
    basis, onehot = _problem(2000)
    sigma = 1.5
    value, w, _ = readout_log_evidence(basis, onehot, sigma)
    _, _, chol, _ = readout_mode(basis, onehot, sigma, w)
    g = torch.Generator().manual_seed(5)
    proposal = torch.distributions.MultivariateNormal(w.reshape(-1), precision_matrix=chol @ chol.T)
    log_w = []
    for _ in range(3):
        eps = torch.randn(10_000, 9, generator=g, dtype=torch.float64)
        draws = w.reshape(-1) + torch.linalg.solve_triangular(chol.T, eps.T, upper=True).T  # N(W*, Λ⁻¹)
        logits = basis @ draws.reshape(-1, 3, 3)  # (draws, N, C)
        ll = (logits * onehot).sum((-1, -2)) - torch.logsumexp(logits, -1).sum(-1)
        prior = torch.distributions.Normal(0.0, sigma).log_prob(draws).sum(-1)
        log_w.append(ll + prior - proposal.log_prob(draws))
    exact = float(torch.logsumexp(torch.cat(log_w), 0) - math.log(30_000))
    assert abs(value - exact) < 0.05, (value, exact)
    # and with few data Laplace is an approximation whose error this test does not bound, only its sign of life
    assert math.isfinite(readout_log_evidence(basis[:20], onehot[:20], sigma)[0])


def test_fixed_prior_is_one_laplace_evidence_and_hierarchical_integrates_the_profile() -> None:
    x, y = _data()
    fixed = laplace_readout_evidence(_tiny("fixed"), x, y)
    design = readout_design(_tiny("fixed"), x, chains=1)[0]
    u, sv, _ = torch.linalg.svd(design, full_matrices=False)
    onehot = torch.nn.functional.one_hot(y, 3).double()
    assert fixed.log_evidence == pytest.approx(readout_log_evidence(u * sv, onehot, 1.5)[0])
    assert fixed.log_scales.tolist() == pytest.approx([math.log(1.5)]) and fixed.sigma_mode == pytest.approx(1.5)
    model = _tiny("hierarchical")
    hier = laplace_readout_evidence(model, x, y, num_scales=15, scale_span=(-3.0, 4.0))
    s, prof = hier.log_scales, hier.scale_profile
    assert s.shape == prof.shape == (15,)
    k = 7  # the grid's profile at s_k is the fixed-prior evidence at σ_p = e^{s_k}
    # to 1e-4: Newton stops at a decrement < 1e-8, and log det Λ moves with the mode to first order (~√1e-8)
    assert prof[k].item() == pytest.approx(readout_log_evidence(u * sv, onehot, math.exp(s[k].item()))[0], abs=1e-4)
    loc = float(model.prior_scale_loc)  # s = log σ_p ~ N(loc, 1)
    assert s[0].item() == pytest.approx(loc - 3.0) and s[-1].item() == pytest.approx(loc + 4.0)
    dens = torch.exp(prof - 0.5 * (s - loc) ** 2 - 0.5 * math.log(2 * math.pi))
    assert hier.log_evidence == pytest.approx(math.log(float(torch.trapezoid(dens, s))), abs=1e-9)


def test_edge_share_is_the_integral_in_the_grid_s_last_five_percent() -> None:
    x, y = _data()
    assert laplace_readout_evidence(_tiny("fixed"), x, y).edge_share == 0.0
    model = _tiny("hierarchical")
    loc = float(model.prior_scale_loc)
    wide = laplace_readout_evidence(model, x, y, num_scales=41, scale_span=(-4.0, 6.0))
    s = wide.log_scales
    trap = torch.full_like(s, 0.25)  # the trapezoid rule's weights on the 0.25-spaced grid
    trap[[0, -1]] = 0.125
    mass = wide.scale_profile - 0.5 * (s - loc) ** 2 - 0.5 * math.log(2 * math.pi) + trap.log()
    assert wide.edge_share == pytest.approx(
        float(torch.exp(torch.logsumexp(mass[39:], 0) - torch.logsumexp(mass, 0))), rel=1e-9
    )
    assert wide.edge_share < 1e-3  # six prior sds above: nothing is cut off
    # a grid that ends below σ_p's posterior mode carries much of the integral at its end, and a lower evidence
    short = laplace_readout_evidence(
        model, x, y, num_scales=21, scale_span=(-4.0, math.log(wide.sigma_mode) - loc - 1.0)
    )
    assert short.edge_share > 0.1 and short.log_evidence < wide.log_evidence


def test_deterministic_transforms_need_one_draw_and_random_ones_average() -> None:
    x, y = _data()
    one = laplace_readout_evidence(_tiny("fixed"), x, y, draws=1)
    four = laplace_readout_evidence(_tiny("fixed"), x, y, draws=4)
    assert four.log_evidence == pytest.approx(one.log_evidence, abs=1e-9)
    a = laplace_readout_evidence(_tiny("fixed", sampling="stochastic"), x, y, draws=4, seed=3)
    b = laplace_readout_evidence(_tiny("fixed", sampling="stochastic"), x, y, draws=4, seed=3)
    c = laplace_readout_evidence(_tiny("fixed", sampling="stochastic"), x, y, draws=4, seed=4)
    assert a.log_evidence == b.log_evidence != c.log_evidence


def test_refusals() -> None:
    x, y = _data()
    with pytest.raises(TypeError, match="InvariantMLP"):
        laplace_readout_evidence(torch.nn.Linear(2, 2), x, y)
    latent = InvariantMLP(image_shape=(1, 4, 4), num_classes=3, hidden=3, num_transforms=2, symmetry_prior="uniform")
    with pytest.raises(ValueError, match="latent"):
        laplace_readout_evidence(latent, x, y)
    with pytest.raises(ValueError, match="scale_span"):
        laplace_readout_evidence(_tiny("hierarchical"), x, y, scale_span=(2.0, 1.0))
    with pytest.raises(ValueError, match="draws"):
        laplace_readout_evidence(_tiny("fixed"), x, y, draws=0)
    with pytest.raises(ValueError):
        laplace_readout_evidence(_tiny("fixed"), x, y[:5])


def test_predictive_matches_importance_weighted_predictions_with_many_data() -> None:
    """2000 images whose labels follow a softmax regression on the model's features: the read-out posterior is
    nearly Gaussian, so the library's Laplace predictive must match the predictive of importance sampling with the
    Laplace proposal (20k draws) to 0.01 in probability."""
    from research.uncertain_symmetry.laplace_evidence import laplace_readout_predictive

    model = _tiny("fixed")
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2005, 1, 4, 4, generator=g)
    design = readout_design(model, x, chains=1)[0]  # (2005, 4): full column rank
    y = torch.distributions.Categorical(
        logits=design @ (3 * torch.randn(4, 3, generator=g, dtype=torch.float64))
    ).sample()
    x, y, x_new, d_new, d = x[:2000], y[:2000], x[2000:], design[2000:], design[:2000]
    got = laplace_readout_predictive(model, x, y, x_new, sigma=1.5, draws=20_000).exp()
    onehot = torch.nn.functional.one_hot(y, 3).double()
    w, _, chol, _ = readout_mode(d, onehot, 1.5)  # in the original coordinates (the prior is isotropic)
    eps = torch.randn(20_000, 12, generator=g, dtype=torch.float64)
    draws = w.reshape(-1) + torch.linalg.solve_triangular(chol.T, eps.T, upper=True).T
    proposal = torch.distributions.MultivariateNormal(w.reshape(-1), precision_matrix=chol @ chol.T)
    logits = d @ draws.reshape(-1, 4, 3)
    ll = (logits * onehot).sum((-1, -2)) - torch.logsumexp(logits, -1).sum(-1)
    log_w = ll + torch.distributions.Normal(0.0, 1.5).log_prob(draws).sum(-1) - proposal.log_prob(draws)
    exact = (torch.softmax(log_w, 0)[:, None, None] * torch.softmax(d_new @ draws.reshape(-1, 4, 3), -1)).sum(0)
    assert torch.allclose(got, exact, atol=0.01), (got, exact)
    assert torch.allclose(got.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(got, laplace_readout_predictive(model, x, y, x_new, sigma=1.5, draws=20_000).exp())


def test_predictive_outside_the_data_is_the_prior() -> None:
    from research.uncertain_symmetry.laplace_evidence import laplace_readout_predictive

    x, y = _data(2)  # 2 images, 4 features: half the feature space is never seen
    model = _tiny("fixed")
    flat = laplace_readout_predictive(model, x, y, x, sigma=1e-4, draws=16)  # a tiny prior scale: 1/C everywhere
    assert torch.allclose(flat.exp(), torch.full((2, 3), 1 / 3, dtype=torch.float64), atol=1e-3)
    new = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    wide = laplace_readout_predictive(model, x, y, new, sigma=1.5, draws=4000)
    assert torch.isfinite(wide).all() and wide.shape == (3, 3)
    with pytest.raises(ValueError, match="sigma"):
        laplace_readout_predictive(model, x, y, x, sigma=0.0)


@pytest.mark.parametrize("symmetry_prior", ["uniform", "logit-normal"])
def test_symmetry_posterior_conditions_the_latent_eta_and_uses_the_model_prior(symmetry_prior: str) -> None:
    """The latent-η model conditioned at η_j has the features of a model built with η fixed at η_j (the same
    init_seed), so the posterior is the grid posterior of those fixed-η evidences times the model's own prior."""
    x, y = _data(12)
    model = tiny_latent_model(symmetry_prior)
    grid = [0.3, 0.9, 1.7, 2.6]
    post = laplace_symmetry_posterior(model, x, y, grid, num_scales=5)
    fixed = [laplace_readout_evidence(_tiny("hierarchical", eta=e), x, y, num_scales=5).log_evidence for e in grid]
    log_prior = bounded_prior(symmetry_prior, model.eta_upper.double()).log_prob(
        torch.tensor(grid, dtype=torch.float64).unsqueeze(-1)
    )
    expected = grid_posterior(grid, fixed, log_prior)
    assert post.log_evidence == pytest.approx(expected.log_evidence, abs=1e-9)
    assert post.density == pytest.approx(expected.density, rel=1e-9)
    assert len(set(post.log_evidence.round(6))) == len(grid)  # η changes the evidence: the condition took effect
    assert post.log_marginal == pytest.approx(expected.log_marginal, abs=1e-9)


def test_symmetry_posterior_default_grid_and_refusals() -> None:
    x, y = _data()
    model = tiny_latent_model("uniform", prior="fixed")
    post = laplace_symmetry_posterior(model, x, y, num_points=3)
    upper = float(model.eta_upper[0])
    assert post.grid == pytest.approx([upper / 4, upper / 2, 3 * upper / 4])
    assert np.trapezoid(post.density, post.grid) == pytest.approx(1.0) and math.isfinite(post.log_marginal)
    with pytest.raises(ValueError, match="latent"):
        laplace_symmetry_posterior(_tiny("fixed"), x, y)
    with pytest.raises(ValueError, match="strictly inside"):
        laplace_symmetry_posterior(model, x, y, [0.0, 1.0])
    with pytest.raises(ValueError, match="strictly inside"):
        laplace_symmetry_posterior(model, x, y, [1.0, upper])
    with pytest.raises(ValueError, match="increasing"):
        laplace_symmetry_posterior(model, x, y, [1.0, 0.5])
    with pytest.raises(ValueError, match="num_points"):
        laplace_symmetry_posterior(model, x, y, num_points=1)
    with pytest.raises(ValueError, match="one value per generator"):
        model.features(x.reshape(len(x), -1), eta=torch.tensor([0.5, 0.5]))


def test_symmetry_predictive_mixes_the_fixed_eta_predictives_by_the_grid_weights() -> None:
    """Full Bayes over η: Σ_j w_j p(y* | x*, D, η_j) with the fixed-η Laplace predictives at each point's σ_p; mass=0
    keeps the posterior's mode alone (type-II on the grid)."""
    x, y = _data(12)
    x_new = _data(5)[0] + 0.1
    model = tiny_latent_model("uniform")
    grid = [0.3, 1.2, 2.4]
    post = laplace_symmetry_posterior(model, x, y, grid, num_scales=5)
    assert isinstance(post, LaplaceSymmetryPosterior) and post.weights().sum() == pytest.approx(1.0)
    assert np.all(post.sigma_modes > 0)
    each = torch.stack(
        [
            laplace_readout_predictive(_tiny("hierarchical", eta=e), x, y, x_new, sigma=float(s), draws=16, seed=2)
            for e, s in zip(grid, post.sigma_modes)
        ]
    )
    w = torch.as_tensor(post.weights())
    full = laplace_symmetry_predictive(model, x, y, x_new, post, mass=1.0, draws=16, seed=2)
    assert full.shape == (5, 3) and torch.allclose(full.exp().sum(-1), torch.ones(5, dtype=full.dtype))
    assert torch.allclose(full, torch.logsumexp(each + w.log()[:, None, None], 0), atol=1e-10)
    w_sorted = np.sort(post.weights())[::-1]
    assert list(post.top_points(0.0)) == [int(np.argmax(post.weights()))] and len(post.top_points(1.0)) == 3
    assert len(post.top_points(float(w_sorted[:2].sum()) - 1e-9)) == 2
    mode = laplace_symmetry_predictive(model, x, y, x_new, post, mass=0.0, draws=16, seed=2)
    assert torch.allclose(mode, each[int(np.argmax(post.weights()))], atol=1e-10)


def test_symmetry_predictive_refusals() -> None:
    x, y = _data()
    model = tiny_latent_model("uniform")
    post = laplace_symmetry_posterior(model, x, y, [0.5, 1.5], num_scales=3)
    plain = grid_posterior(post.grid, post.log_evidence, np.zeros(2))
    with pytest.raises(TypeError, match="LaplaceSymmetryPosterior"):
        laplace_symmetry_predictive(model, x, y, x, plain)
    with pytest.raises(ValueError, match="mass"):
        laplace_symmetry_predictive(model, x, y, x, post, mass=1.5)
    with pytest.raises(ValueError, match="latent"):
        laplace_symmetry_predictive(_tiny("fixed"), x, y, x, post)
    with pytest.raises(ValueError, match="sigma_modes"):
        LaplaceSymmetryPosterior.from_grid(plain, [1.0, -1.0])
