"""BasisRegression: exact evidence / posterior against dense references, Pyro consistency, λ selection."""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO
from pyro.poutine.util import site_is_subsample

from pyro_invariance.models.basis_regression import BasisRegression, make_symmetric_toy
from pyro_invariance.registry import MODELS

torch.set_num_threads(1)

GRID = torch.linspace(0.0, 2.0, 41, dtype=torch.float64)


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def dense_log_evidence(model, x, y, lam=None):
    """Σ_d log N(y_d | 0, s_p²ΦΦᵀ + σ²I) with a dense N×N covariance."""
    phi = model.features(x.double(), lam=lam)
    y = y.double().reshape(x.shape[0], -1)
    cov = model.prior_scale**2 * phi @ phi.T + model.noise_scale**2 * torch.eye(x.shape[0], dtype=torch.float64)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(x.shape[0], dtype=torch.float64), covariance_matrix=cov)
    return mvn.log_prob(y.T).sum()


def evidence_curve(model, x, y):
    return torch.stack([model.log_evidence(x, y, lam=lam) for lam in GRID])


CONFIGS = [
    dict(basis="rbf"),
    dict(basis="rbf", num_features=7, lengthscale=0.8, prior_scale=0.7, noise_scale=0.3),
    dict(basis="rff", num_features=16),
    dict(basis="poly", degree=5, noise_scale=0.5),
    dict(basis="rbf", in_features=2, num_features=9, lengthscale=1.0),
    dict(basis="rff", in_features=2, num_features=12),
    dict(basis="poly", in_features=2, degree=3, noise_scale=0.5),
]


def toy_for(cfg, n=30, out_features=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_in = cfg.get("in_features", 1)
    x = 6 * torch.rand(n, d_in, generator=g) - 3
    y = torch.cos(2 * x.sum(-1, keepdim=True)) + 0.3 * x[:, :1] + 0.2 * torch.randn(n, out_features, generator=g)
    return x, y


# --------------------------------------------------------------------------------------------------
# exact inference against dense references


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['basis']}-{c.get('in_features', 1)}d")
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 1.7])
def test_log_evidence_matches_dense(cfg, lam):
    model = BasisRegression(out_features=2, eta_init=lam, learn_symmetry=False, **cfg)
    x, y = toy_for(cfg)
    ev = model.log_evidence(x, y)
    assert ev.dtype == torch.float64 and ev.dim() == 0
    torch.testing.assert_close(ev, dense_log_evidence(model, x, y), rtol=1e-9, atol=1e-8)


def test_single_output_accepts_flat_y():
    model = BasisRegression(learn_symmetry=False)
    x, y = make_symmetric_toy(20, seed=3)
    torch.testing.assert_close(model.log_evidence(x[:, 0], y[:, 0]), model.log_evidence(x, y))
    torch.testing.assert_close(model.log_evidence(x, y), dense_log_evidence(model, x, y), rtol=1e-9, atol=1e-8)


@pytest.mark.parametrize("cfg", CONFIGS[:4], ids=lambda c: c["basis"])
def test_posterior_matches_dense_bayesian_linear_regression(cfg):
    model = BasisRegression(out_features=3, eta_init=0.4, learn_symmetry=False, **cfg)
    x, y = toy_for(cfg, out_features=3)
    mean, cov = model.posterior(x, y)
    f = model.num_features
    assert mean.shape == (3, f) and cov.shape == (f, f)
    # Function-space form (Gaussian conditioning of w on y = Φw + ε), independent of the F×F route.
    phi = model.features(x.double())
    sp2, s2 = model.prior_scale**2, model.noise_scale**2
    gram = sp2 * phi @ phi.T + s2 * torch.eye(x.shape[0], dtype=torch.float64)
    dense_mean = (sp2 * phi.T @ torch.linalg.solve(gram, y.double())).T
    dense_cov = sp2 * torch.eye(f, dtype=torch.float64) - sp2**2 * phi.T @ torch.linalg.solve(gram, phi)
    torch.testing.assert_close(mean, dense_mean, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(cov, dense_cov, rtol=1e-7, atol=1e-7)
    # Predictive mean / variance of f at new points.
    x_new = torch.linspace(-3, 3, 7).reshape(-1, 1)
    pm, pv = model.predict(x_new, x, y)
    phi_new = model.features(x_new.double())
    k_new = sp2 * phi_new @ phi.T
    torch.testing.assert_close(pm, k_new @ torch.linalg.solve(gram, y.double()), rtol=1e-7, atol=1e-7)
    dense_var = sp2 * (phi_new**2).sum(-1) - (k_new * torch.linalg.solve(gram, k_new.T).T).sum(-1)
    torch.testing.assert_close(pv, dense_var, rtol=1e-6, atol=1e-8)
    _, pv_noisy = model.predict(x_new, x, y, include_noise=True)
    torch.testing.assert_close(pv_noisy, pv + s2)


def test_log_evidence_gradient_in_lambda_matches_finite_differences():
    model = BasisRegression(out_features=2, learn_symmetry=False)
    x, y = make_symmetric_toy(25, seed=1, even=False, num_outputs=2)
    for lam0 in (0.3, 1.4):
        lam = torch.tensor(lam0, dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(model.log_evidence(x, y, lam=lam), lam)
        h = 1e-5
        fd = (model.log_evidence(x, y, lam=lam0 + h) - model.log_evidence(x, y, lam=lam0 - h)) / (2 * h)
        assert torch.isfinite(grad) and grad.abs() > 1e-3
        torch.testing.assert_close(grad, fd.detach(), rtol=1e-5, atol=1e-5)


def test_learnt_lambda_is_a_pyro_param_with_gradient():
    model = BasisRegression(eta_init=0.5)
    x, y = make_symmetric_toy(25, seed=2)
    params = list(model.parameters())
    assert len(params) == 1  # only λ (unconstrained); the weight is a latent site
    model.log_evidence(x, y).backward()
    assert params[0].grad is not None and torch.isfinite(params[0].grad).all() and params[0].grad.abs() > 0
    assert set(model.symmetry_summary()) == {"lambda"}
    assert model.symmetry_summary()["lambda"].requires_grad is False


# --------------------------------------------------------------------------------------------------
# model selection of λ


@pytest.mark.parametrize("basis", ["rbf", "rff"])
def test_evidence_prefers_lambda_one_on_even_data(basis):
    model = BasisRegression(basis=basis, out_features=2, prior_scale=0.5, learn_symmetry=False)
    for seed in range(3):
        x, y = make_symmetric_toy(40, seed=seed, even=True, num_outputs=2)
        curve = evidence_curve(model, x, y)
        best = GRID[curve.argmax()].item()
        assert abs(best - 1.0) <= 0.15, (seed, best)
        assert curve[20] > curve[0] + 5.0  # λ=1 beats "no symmetry" clearly


@pytest.mark.parametrize("basis", ["rbf", "rff"])
def test_evidence_rejects_symmetry_on_non_symmetric_data(basis):
    model = BasisRegression(basis=basis, out_features=2, prior_scale=0.5, learn_symmetry=False)
    for seed in range(3):
        x, y = make_symmetric_toy(40, seed=seed, even=False, num_outputs=2)
        curve = evidence_curve(model, x, y)
        best = GRID[curve.argmax()].item()
        # The basis is closed under x -> -x, so λ and 2 - λ are the same model: "no symmetry" is
        # either end of [0, 2].
        assert min(best, 2.0 - best) <= 0.25, (seed, best)
        assert curve[20] < curve[0] - 100.0  # the even-only model cannot fit the odd part


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['basis']}-{c.get('in_features', 1)}d")
def test_evidence_is_symmetric_about_lambda_one(cfg):
    """For a basis closed under reflection, k_λ = k_even + (1-λ)² k_odd: p(y|λ) = p(y|2-λ)."""
    model = BasisRegression(out_features=2, learn_symmetry=False, **cfg)
    x, y = toy_for(cfg)
    curve = evidence_curve(model, x, y)
    torch.testing.assert_close(curve, curve.flip(0), rtol=1e-9, atol=1e-7)


def test_gradient_ascent_on_evidence_learns_lambda():
    x_even, y_even = make_symmetric_toy(40, seed=0, even=True)
    x_odd, y_odd = make_symmetric_toy(40, seed=0, even=False)
    for (x, y), target in (((x_even, y_even), 1.0), ((x_odd, y_odd), 0.0)):
        pyro.clear_param_store()
        model = BasisRegression(prior_scale=0.5, eta_init=0.6)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        for _ in range(150):
            opt.zero_grad()
            (-model.log_evidence(x, y)).backward()
            opt.step()
        assert abs(model.symmetry_summary()["lambda"].item() - target) < 0.1


# --------------------------------------------------------------------------------------------------
# Pyro consistency


def hand_log_joint(model, x, w, y, scale=1.0):
    phi = model.features(x)
    prior = dist.Normal(0.0, model.prior_scale).log_prob(w).sum()
    lik = dist.Normal(phi @ w.T, model.noise_scale).log_prob(y.reshape(x.shape[0], -1)).sum()
    return prior + scale * lik


def test_trace_log_joint_matches_hand_computation():
    model = BasisRegression(out_features=2, eta_init=0.7)
    x, y = make_symmetric_toy(24, seed=4, num_outputs=2)
    w = torch.randn(2, model.num_features, generator=torch.Generator().manual_seed(0))
    prior_trace = poutine.trace(model).get_trace(x, y)
    latent = [n for n, s in prior_trace.nodes.items() if s["type"] == "sample" and not site_is_subsample(s)]
    assert latent == ["weight", "obs"] and prior_trace.observation_nodes == ["obs"]
    assert prior_trace.nodes["weight"]["fn"].event_shape == (2, model.num_features)
    assert prior_trace.nodes["weight"]["fn"].batch_shape == ()
    tr = poutine.trace(poutine.condition(model, data={"weight": w})).get_trace(x, y)
    torch.testing.assert_close(tr.log_prob_sum(), hand_log_joint(model, x, w, y), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(tr.nodes["_RETURN"]["value"], model.features(x) @ w.T)


def test_num_data_scales_the_likelihood_exactly():
    model = BasisRegression(out_features=2, eta_init=0.7)
    x, y = make_symmetric_toy(24, seed=5, num_outputs=2)
    w = torch.randn(2, model.num_features, generator=torch.Generator().manual_seed(1))
    conditioned = poutine.condition(model, data={"weight": w})
    full = poutine.trace(conditioned).get_trace(x, y).log_prob_sum()
    batch_joints = []
    for idx in torch.arange(24).reshape(4, 6):
        tr = poutine.trace(conditioned).get_trace(x[idx], y[idx], num_data=24)
        torch.testing.assert_close(tr.log_prob_sum(), hand_log_joint(model, x[idx], w, y[idx], scale=4.0))
        batch_joints.append(tr.log_prob_sum())
    # Averaging the scaled minibatch joints over a partition recovers the full-data joint.
    torch.testing.assert_close(torch.stack(batch_joints).mean(), full, rtol=1e-5, atol=1e-4)


def exact_guide_for(model, x, y, cov_factor=1.0, dtype=torch.float64):
    """A guide sampling the exact matrix-normal posterior as rows ~ N(M_d, Σ) (dense MVN)."""
    mean, cov = model.posterior(x, y)
    scale_tril = torch.linalg.cholesky(cov_factor * cov)
    mean, scale_tril = mean.to(dtype), scale_tril.to(dtype)

    def guide(x, y=None, num_data=None):
        pyro.sample("weight", dist.MultivariateNormal(mean, scale_tril=scale_tril).to_event(1))

    return guide


@pytest.mark.parametrize("vectorize", [False, True])
def test_elbo_with_exact_posterior_equals_log_evidence(vectorize):
    with default_dtype(torch.float64):
        model = BasisRegression(out_features=2, eta_init=0.8)
        x, y = make_symmetric_toy(30, seed=6, num_outputs=2)
        evidence = model.log_evidence(x, y)
        guide = exact_guide_for(model, x, y)
        elbo = Trace_ELBO(num_particles=64, vectorize_particles=vectorize, max_plate_nesting=1)
        estimate = -elbo.loss(model, guide, x, y)
    # log p(y, w) - log q(w) = log p(y) for every w under the exact posterior: no MC error at all.
    assert abs(estimate - evidence.item()) < 1e-6 * abs(evidence.item()) + 1e-6


def test_elbo_with_exact_posterior_float32():
    model = BasisRegression(out_features=2, eta_init=0.8)
    x, y = make_symmetric_toy(30, seed=6, num_outputs=2)
    evidence = model.log_evidence(x, y).item()
    guide = exact_guide_for(model, x, y, dtype=torch.float32)
    estimate = -Trace_ELBO(num_particles=200).loss(model, guide, x, y)
    assert abs(estimate - evidence) < 1e-3


def test_elbo_gap_is_kl_to_the_exact_posterior():
    """A worse guide (posterior covariance inflated) loses exactly KL(q || posterior), to MC error."""
    with default_dtype(torch.float64):
        model = BasisRegression(out_features=2, eta_init=0.8, num_features=8, lengthscale=1.0)
        x, y = make_symmetric_toy(30, seed=7, num_outputs=2)
        evidence = model.log_evidence(x, y).item()
        mean, cov = model.posterior(x, y)
        q = dist.MultivariateNormal(mean, 2.0 * cov)
        p = dist.MultivariateNormal(mean, cov)
        kl = torch.distributions.kl_divergence(q, p).sum().item()  # = (F·D/2)(1 - ln 2)
        guide = exact_guide_for(model, x, y, cov_factor=2.0)
        pyro.set_rng_seed(0)
        elbo = Trace_ELBO(num_particles=4000, vectorize_particles=True, max_plate_nesting=1)
        estimate = -elbo.loss(model, guide, x, y)
    # Per particle, log p(y, w) - log q(w) = evidence - (|ε|²/2 - (F·D/2) ln 2) with ε ~ N(0, I_{F·D}):
    # std sqrt(F·D/2) = 2.8, so the 4000-particle mean has std 0.045.
    assert math.isclose(kl, 8 * (1 - math.log(2)), rel_tol=1e-9)
    assert abs(estimate - (evidence - kl)) < 0.15
    assert estimate < evidence


def test_predictive_and_vectorised_weight_shapes():
    model = BasisRegression(out_features=3, eta_init=0.5)
    x, _ = make_symmetric_toy(10, seed=8)
    for parallel in (False, True):
        samples = Predictive(model, num_samples=5, parallel=parallel, return_sites=["weight", "obs", "_RETURN"])(x)
        assert samples["obs"].shape == (5, 10, 3)
        assert samples["_RETURN"].shape == (5, 10, 3)
    # A batched weight (..., 1, D_out, F) gives a mean of shape (..., B, D_out).
    w = torch.randn(4, 1, 3, model.num_features)
    mean = poutine.condition(model, data={"weight": w})(x)
    assert mean.shape == (4, 10, 3)
    torch.testing.assert_close(mean[2], model.features(x) @ w[2, 0].T)


def test_registry_and_symmetry_parameters():
    assert "basis-regression" in MODELS
    model = MODELS.get("basis-regression", out_features=2, eta_init=0.25)
    assert isinstance(model, BasisRegression)
    lam = model.symmetry_summary()["lambda"]
    assert lam.shape == () and math.isclose(lam.item(), 0.25, rel_tol=1e-5)
    assert model.symmetry_parameters() == [model.lam_unconstrained]
    fixed = BasisRegression(eta_init=1.0, learn_symmetry=False)
    assert list(fixed.parameters()) == [] and fixed.symmetry_summary()["lambda"].item() == 1.0
    assert fixed.symmetry_parameters() == []


def test_features_interpolate_between_basis_and_mirror():
    model = BasisRegression(learn_symmetry=False)
    x = torch.linspace(-2.5, 2.5, 11)
    phi0, phi1, phi2 = (model.features(x, lam=v) for v in (0.0, 1.0, 2.0))
    torch.testing.assert_close(phi2, model.features(-x, lam=0.0))  # λ = 2: mirrored
    torch.testing.assert_close(phi1, model.features(-x, lam=1.0))  # λ = 1: even
    torch.testing.assert_close(phi1, 0.5 * (phi0 + phi2))
    assert phi0.shape == (11, model.num_features)


def test_toy_data():
    x, y = make_symmetric_toy(50, seed=0, noise=0.0, num_outputs=3)
    assert x.shape == (50, 1) and y.shape == (50, 3)
    torch.testing.assert_close(y[:, 0], torch.cos(2 * x[:, 0]))
    x2, y2 = make_symmetric_toy(50, seed=0, noise=0.1, num_outputs=3)
    x3, y3 = make_symmetric_toy(50, seed=0, noise=0.1, num_outputs=3)
    assert torch.equal(x2, x3) and torch.equal(y2, y3) and torch.equal(x, x2)
    _, y_odd = make_symmetric_toy(50, seed=0, noise=0.0, even=False)
    torch.testing.assert_close(y_odd[:, 0], torch.cos(2 * x[:, 0]) + torch.sin(2 * x[:, 0]))


# --------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prior_scale=-1.0), "prior_scale"),
        (dict(noise_scale=0.0), "noise_scale"),
        (dict(lengthscale=float("nan")), "lengthscale"),
        (dict(num_features=0), "num_features"),
        (dict(in_features=0), "in_features"),
        (dict(out_features=1.5), "out_features"),
        (dict(basis="fourier"), "unknown basis"),
        (dict(eta_init=2.5, learn_symmetry=False), r"\[0, 2\]"),
        (dict(eta_init=0.0), r"\(0, 2\)"),
        (dict(eta_init=2.0), r"\(0, 2\)"),
        (dict(basis="rff", num_features=7), "even"),
        (dict(basis="rbf", in_features=2, num_features=10), "m\\*\\*2"),
        (dict(basis="poly", degree=3, num_features=10), "poly"),
        (dict(basis="poly", degree=0), "degree"),
        (dict(centres=torch.zeros(5, 2)), "centres"),
        (dict(lo=1.0, hi=-1.0), "lo < hi"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BasisRegression(**kwargs)


def test_bad_inputs():
    model = BasisRegression(out_features=2, eta_init=0.5)
    x, y = make_symmetric_toy(10, seed=0, num_outputs=2)
    bad_x_nan = x.clone()
    bad_x_nan[3, 0] = float("nan")
    bad_y_inf = y.clone()
    bad_y_inf[1, 1] = float("inf")
    cases = [
        (torch.randn(10, 2), y),  # wrong D_in
        (x, y[:, :1]),  # wrong D_out
        (x, y[:, 0]),  # flat y with two outputs
        (x[:9], y),  # rows mismatch
        (bad_x_nan, y),
        (x, bad_y_inf),
        (torch.randn(10, 1, 1), y),  # wrong rank
        (torch.zeros(0, 1), torch.zeros(0, 2)),  # empty
    ]
    for bx, by in cases:
        with pytest.raises(ValueError):
            model.prepare_inputs(bx, by)  # the data boundary of fit / evaluate
        if by is not bad_y_inf:  # forward reads no value (no host sync): non-finite y pass there
            with pytest.raises(ValueError):
                model(bx, by)
        with pytest.raises(ValueError):
            model.log_evidence(bx, by)
        with pytest.raises(ValueError):
            model.posterior(bx, by)
    with pytest.raises(ValueError, match="num_data"):
        model(x, y, num_data=5)
    with pytest.raises(ValueError, match="lam"):
        model.log_evidence(x, y, lam=2.5)
    with pytest.raises(ValueError):
        make_symmetric_toy(0)
    with pytest.raises(ValueError):
        make_symmetric_toy(10, noise=-1.0)
