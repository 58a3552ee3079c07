"""Posteriors over symmetry parameters: grid posteriors, the exact p(λ | D) of basis
regression, the NUTS references with η latent, and the variational q(λ) against the exact posterior."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pytest  # noqa: E402
from scipy import integrate, stats  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry, load_reference  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import (  # noqa: E402
    exact_symmetry_posterior,
    grid_posterior,
    symmetry_draws,
)
from pyro_invariance.models.basis_regression import BasisRegression, make_symmetric_toy  # noqa: E402

#: The variational fit of the accuracy criterion below, fixed before any q(λ) was looked at (the same as
#: ``research/uncertain_symmetry/scripts/symmetry_posterior_basis.py``): the full-rank guide, a joint Gaussian over
#: (weight, logit λ/2), is the family that can carry the λ–weight correlation (the odd part of the
#: weights is free at λ = 1 and pinned by the data away from it); its settings are those of the
#: full-rank check against the fixed-λ reference (tests/diagnostics/test_reference.py: lr 0.05 for means,
#: scales and factors, init scale 0.3) with the reference module's default of 1500 steps for
#: ``score``, full batch, and the model's default of 4 ELBO particles. q(λ) is read from 4000 draws.
VI_GUIDE = "full-rank"
VI_INIT_SCALE = 0.3
VI_FIT = {"steps": 1500, "lr": 0.05, "factor_lr": 0.05, "batch_size": None, "num_particles": 4}
VI_DRAWS = 4000
VI_SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


# ------------------------------------------------------------------------------------------------
# grid_posterior


def test_grid_posterior_of_a_gaussian_log_evidence():
    mu, sigma, const = 0.3, 0.7, 17.0
    grid = np.linspace(mu - 8 * sigma, mu + 8 * sigma, 4001)
    log_ev = const - 0.5 * ((grid - mu) / sigma) ** 2
    post = grid_posterior(grid, log_ev, np.zeros_like(grid))  # flat prior: the posterior is N(mu, sigma²)
    assert post.mean == pytest.approx(mu, abs=1e-8)
    assert post.sd == pytest.approx(sigma, rel=1e-5)
    assert post.mode == pytest.approx(mu, abs=grid[1] - grid[0])
    assert post.cdf(mu) == pytest.approx(0.5, abs=1e-6)
    assert post.cdf(mu + sigma) == pytest.approx(stats.norm.cdf(1.0), abs=1e-5)
    assert post.quantile(0.975) == pytest.approx(mu + stats.norm.ppf(0.975) * sigma, abs=1e-4)
    assert post.quantile(0.1) == pytest.approx(mu + stats.norm.ppf(0.1) * sigma, abs=1e-4)
    assert post.mass(mu - sigma, mu + sigma) == pytest.approx(stats.norm.cdf(1) - stats.norm.cdf(-1), abs=1e-5)
    assert post.mass() == pytest.approx(1.0) and post.cumulative()[-1] == pytest.approx(1.0)
    assert np.trapezoid(post.density, post.grid) == pytest.approx(1.0)
    # log p(D) = const + log ∫ exp(−(η−μ)²/2σ²) dη
    assert post.log_marginal == pytest.approx(const + math.log(sigma * math.sqrt(2 * math.pi)), abs=1e-6)
    np.testing.assert_array_equal(post.log_evidence, log_ev)

    # a Gaussian prior N(m0, s0²): the posterior is the product's Gaussian
    m0, s0 = -0.5, 1.2
    log_prior = stats.norm.logpdf(grid, m0, s0)
    post = grid_posterior(torch.as_tensor(grid), torch.as_tensor(log_ev), log_prior.tolist())
    prec = 1 / sigma**2 + 1 / s0**2
    assert post.mean == pytest.approx((mu / sigma**2 + m0 / s0**2) / prec, abs=1e-6)
    assert post.sd == pytest.approx(prec**-0.5, rel=1e-5)


def test_grid_posterior_rejects_bad_inputs():
    g = np.linspace(0, 1, 5)
    with pytest.raises(ValueError, match="1-D of one length"):
        grid_posterior(g, np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match="1-D of one length"):
        grid_posterior(g, np.zeros(5), np.zeros(4))
    with pytest.raises(ValueError, match="1-D of one length"):
        grid_posterior([0.5], [0.0], [0.0])
    with pytest.raises(ValueError, match="1-D of one length"):
        grid_posterior(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="strictly increasing"):
        grid_posterior(g[::-1], np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="strictly increasing"):
        grid_posterior([0.0, 0.5, 0.5, 1.0], np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        grid_posterior(g, [0.0, 0.0, np.nan, 0.0, 0.0], np.zeros(5))
    with pytest.raises(ValueError, match="finite"):
        grid_posterior(g, np.zeros(5), [-np.inf, 0.0, 0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------------
# the exact posterior of λ


def _lambda_model(symmetry_prior="uniform", n=60, seed=0):
    """The basis-regression-lambda reference's model and data (or another data set of its kind)."""
    kwargs = {k: v for k, v in entry("basis-regression-lambda").model_kwargs.items() if k != "symmetry_prior"}
    model = BasisRegression(symmetry_prior=symmetry_prior, **kwargs)
    x, y = make_symmetric_toy(n=n, seed=seed, noise=0.3, even=True)
    return model, x, y


@pytest.mark.parametrize("symmetry_prior", ["uniform", "logit-normal"])
def test_exact_symmetry_posterior_matches_brute_force_normalisation(symmetry_prior):
    """Adaptive quadrature (scipy's QUADPACK) of p(D | λ) p(λ) over (0, 2), evaluated point by point
    from ``log_evidence`` and the prior, gives the same normaliser, mean, sd and CDF."""
    model, x, y = _lambda_model(symmetry_prior)
    post = exact_symmetry_posterior(model, x, y)
    prior = pi.symmetry.priors.bounded_prior(symmetry_prior, torch.tensor(2.0, dtype=torch.float64))

    def log_joint(lam):
        lam_t = torch.tensor(lam, dtype=torch.float64)
        return float(model.log_evidence(x, y, lam=lam_t) + prior.log_prob(lam_t))

    top = max(post.log_evidence)
    lo, hi = post.grid[0], post.grid[-1]

    def moment(k, a=lo, b=hi):
        f = lambda lam: lam**k * math.exp(log_joint(lam) - top)  # noqa: E731
        return integrate.quad(
            f, a, b, points=[p for p in (0.8, 1.0, 1.2) if a < p < b], limit=200, epsabs=0.0, epsrel=1e-10
        )[0]

    # on the grid's own range [λ_1, λ_G]: only the trapezoidal rule's error is left
    z = moment(0)
    mean, second = moment(1) / z, moment(2) / z
    assert post.log_marginal == pytest.approx(top + math.log(z), abs=1e-6)
    assert post.mean == pytest.approx(mean, abs=1e-7)
    assert post.sd == pytest.approx(math.sqrt(second - mean**2), rel=1e-5)
    assert post.cdf(0.9) == pytest.approx(moment(0, lo, 0.9) / z, abs=1e-5)
    # on all of (0, 2): the two end cells left out (width 1/1001 each) change the sd by < 1e-3
    z_all = moment(0, 0.0, 2.0)
    sd_all = math.sqrt(moment(2, 0.0, 2.0) / z_all - (moment(1, 0.0, 2.0) / z_all) ** 2)
    assert post.sd == pytest.approx(sd_all, rel=1e-3)
    assert post.log_marginal == pytest.approx(top + math.log(z_all), abs=1e-4)
    assert post.log_marginal == pytest.approx(float(model.log_marginal_evidence(x, y)), abs=1e-4)  # + end cells
    assert len(post.grid) == 2001 and 0.0 < post.grid[0] and post.grid[-1] < 2.0


def test_exact_symmetry_posterior_is_symmetric_about_one():
    model, x, y = _lambda_model()
    post = exact_symmetry_posterior(model, x, y)
    np.testing.assert_allclose(post.grid + post.grid[::-1], 2.0, atol=1e-12)
    np.testing.assert_allclose(post.density, post.density[::-1], rtol=1e-8)
    assert post.mean == pytest.approx(1.0, abs=1e-9)
    assert post.quantile(0.25) + post.quantile(0.75) == pytest.approx(2.0, abs=1e-6)
    for lam in (0.1, 0.37, 0.8):  # p(D | λ) = p(D | 2 − λ) pointwise, for any data
        for data in ((x, y), make_symmetric_toy(n=15, seed=3, noise=0.3, even=False)):
            assert float(model.log_evidence(*data, lam=lam)) == pytest.approx(
                float(model.log_evidence(*data, lam=2.0 - lam)), abs=1e-8
            )


def test_exact_symmetry_posterior_shape_of_the_reference_data():
    """The data setting of the basis-regression-lambda reference (chosen from this shape alone):
    unimodal with its mode at λ = 1 and a sharp top, where the 20 points of the fixed-λ reference
    have two modes either side of 1."""
    model, x, y = entry("basis-regression-lambda").build()
    post = exact_symmetry_posterior(model, x, y)
    d = post.density
    peaks = [post.grid[i] for i in range(1, len(d) - 1) if d[i] >= d[i - 1] and d[i] >= d[i + 1]]
    assert peaks == [pytest.approx(1.0, abs=1e-6)]
    assert 0.12 < post.sd < 0.18
    at = lambda v: float(np.interp(v, post.grid, d))  # noqa: E731
    assert at(0.9) < 0.6 * at(1.0)  # not flat-topped
    kurtosis = np.trapezoid((post.grid - 1.0) ** 4 * d, post.grid) / post.sd**4
    assert kurtosis > 5.0  # heavy-tailed: a Gaussian q cannot match both its core and its sd

    small, xs, ys = _lambda_model(n=20)
    two = exact_symmetry_posterior(small, xs, ys)
    assert two.mode != pytest.approx(1.0, abs=0.02)
    assert float(np.interp(1.0, two.grid, two.density)) < two.density.max()


def test_exact_symmetry_posterior_needs_a_latent_lambda():
    model, x, y = _lambda_model()
    fixed = BasisRegression(basis="rbf", num_features=8, learn_symmetry=False)
    with pytest.raises(ValueError, match="needs a BasisRegression with a latent λ") as info:
        exact_symmetry_posterior(fixed, x, y)
    assert "\n" not in str(info.value)
    learnt = BasisRegression(basis="rbf", num_features=8)
    with pytest.raises(ValueError, match="symmetry_prior=None"):
        exact_symmetry_posterior(learnt, x, y)
    other = pi.MODELS.get("rotation-toy-2d", symmetry_prior="uniform", hidden=4)
    with pytest.raises(ValueError, match="got RotationToy|got .* with symmetry_prior='uniform'"):
        exact_symmetry_posterior(other, x, y)
    with pytest.raises(ValueError, match="num_points"):
        exact_symmetry_posterior(model, x, y, num_points=2)


# ------------------------------------------------------------------------------------------------
# the NUTS reference with λ latent


def _reference_lambda():
    ref = load_reference("basis-regression-lambda")
    model, x, y = ref.entry.build()
    return ref, model, x, y, exact_symmetry_posterior(model, x, y)


def test_nuts_reference_of_lambda_matches_the_exact_posterior():
    """The stored joint NUTS draws of λ against the quadrature posterior.

    Tolerances from the Monte-Carlo error at the stored bulk ESS of λ (> 3000): the mean's standard
    error is ≤ 0.02 sd; the sd's is ≈ √(κ − 1)/(2√ESS) ≤ 2.5 % with the posterior's kurtosis κ ≈ 8.8;
    the Kolmogorov distance of ESS effective draws is ≈ 0.9/√ESS ≤ 0.016 at its median."""
    ref, model, x, y, post = _reference_lambda()
    lam = ref.draws["lam"].astype(np.float64).ravel()
    assert ref.metadata["diagnostics"]["sites"]["lam"]["ess_bulk_min"] > 3000
    assert abs(lam.mean() - post.mean) < 0.1 * post.sd
    assert abs(lam.std(ddof=1) / post.sd - 1.0) < 0.1
    s = np.sort(lam)
    cdf = np.interp(s, post.grid, post.cumulative())
    ks = max(np.max(np.arange(1, len(s) + 1) / len(s) - cdf), np.max(cdf - np.arange(len(s)) / len(s)))
    assert ks < 0.04
    for level in (0.05, 0.25, 0.75, 0.95):
        assert np.mean(lam <= post.quantile(level)) == pytest.approx(level, abs=0.03)

    # the weights: the exact marginal is the mixture ∫ N(M(λ), Σ(λ)) p(λ | D) dλ
    grid, dens = post.grid[::5], post.density[::5]
    dens = dens / np.trapezoid(dens, grid)
    means, covs = zip(*(model.posterior(x, y, lam=float(v)) for v in grid))
    m = torch.stack(means)[:, 0].numpy()  # (G, F)
    v = torch.stack([c.diagonal() for c in covs]).numpy()
    mean_w = np.trapezoid(m * dens[:, None], grid, axis=0)
    var_w = np.trapezoid((v + (m - mean_w) ** 2) * dens[:, None], grid, axis=0)
    w = ref.draws["weight"].astype(np.float64).reshape(-1, m.shape[1])
    assert np.max(np.abs(w.mean(0) - mean_w) / np.sqrt(var_w)) < 0.1
    ratio = w.var(0, ddof=1) / var_w
    assert 0.8 < ratio.min() and ratio.max() < 1.2, ratio


# ------------------------------------------------------------------------------------------------
# the variational q(λ) against the exact posterior (mean within 0.1·sd, sd within 25 %)


_Q_LAMBDA: dict[tuple[str, int], np.ndarray] = {}
_ELBO_FITS: dict[tuple[str, int], tuple] = {}  # the fitted (model, guide, x, y), until the IWAE test takes it


def _elbo_fit(guide_name, seed):
    """The ELBO fit with the settings above: the one left by :func:`_q_lambda` if the IWAE test has not
    taken it yet (the same numbers: ``fit`` reseeds), else a new one."""
    if (guide_name, seed) in _ELBO_FITS:
        return _ELBO_FITS.pop((guide_name, seed))
    pyro.clear_param_store()
    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get(guide_name, model, init_scale=VI_INIT_SCALE)
    pi.fit(model, guide, (x, y), seed=seed, progress=False, **VI_FIT)
    return model, guide, x, y


def _q_lambda(guide_name, seed):
    """Draws of q(λ) after the fit above (cached: the tests below share the three fits)."""
    key = (guide_name, seed)
    if key not in _Q_LAMBDA:
        model, guide, x, y = _elbo_fit(guide_name, seed)
        _Q_LAMBDA[key] = symmetry_draws(model, guide, x, y, num_samples=VI_DRAWS, seed=seed)["lam"].double().numpy()
        _ELBO_FITS[key] = (model, guide, x, y)
    return _Q_LAMBDA[key]


@pytest.fixture(scope="module")
def exact_lambda():
    model, x, y = entry("basis-regression-lambda").build()
    return exact_symmetry_posterior(model, x, y)


# one fit each (1500 steps × 4 particles): 6–13 s on the shared 2-core machine at a load of 2–3
@pytest.mark.parametrize("seed", VI_SEEDS)
def test_variational_q_lambda_mean_matches_and_sd_is_too_narrow(seed, exact_lambda):
    """The accuracy criterion, "the variational q(λ) mean within 0.1·sd and sd within 25 % of the exact
    quadrature posterior", with the full-rank guide and the settings fixed above: the mean part holds
    on each of seeds 0, 1, 2; the sd part does not.

    Measured (research/uncertain_symmetry/results/symmetry_posterior_basis.md): mean errors +0.001, −0.005, +0.014 sd;
    sd ratios 0.609, 0.607, 0.600 (with the training loop before vectorised particles,
    another random stream: −0.033, +0.054, −0.021 sd and 0.591, 0.608, 0.594). The exact p(λ | D) has
    a sharp top and heavy shoulders (kurtosis 8.8); the logit-normal q(λ) of a joint Gaussian fits its
    core — q's interquartile range is 7–10 % below the exact one — and leaves out the shoulders, which
    carry much of the variance. (The mean-field guide fails the other way: q(λ) 2.5× too wide.)"""
    post = exact_lambda
    lam = _q_lambda(VI_GUIDE, seed)
    assert abs(lam.mean() - post.mean) < 0.1 * post.sd
    ratio = lam.std(ddof=1) / post.sd
    assert 0.45 < ratio < 0.75, ratio  # the criterion's 0.75 < ratio < 1.25 fails here (RWS meets it: test below)
    exact_iqr = post.quantile(0.75) - post.quantile(0.25)
    iqr = np.quantile(lam, 0.75) - np.quantile(lam, 0.25)
    assert abs(iqr / exact_iqr - 1.0) < 0.2


# the ELBO fit, then the importance-weighted bound
# (research/uncertain_symmetry/scripts/symmetry_posterior_basis.py's REFINE, fixed there)
VI_REFINE = {"elbo": "iwae", "num_particles": 16, "steps": 1000, "lr": 0.005, "factor_lr": 0.005, "batch_size": None}


# two fits each (1500 ELBO steps × 4 particles, 1000 IWAE steps × 16): ~15 s on the shared 2-core machine
@pytest.mark.parametrize("seed", VI_SEEDS)
def test_iwae_refinement_widens_q_lambda_towards_the_exact_sd(seed, exact_lambda):
    """Continuing the full-rank fit with the K = 16 importance-weighted bound (``elbo="iwae"``) moves
    q(λ) from covering the exact posterior's core to covering most of its shoulders. Measured
    (research/uncertain_symmetry/results/symmetry_posterior_basis.md): sd ratios 0.870, 0.848, 0.784 (ELBO alone 0.61),
    mean errors +0.17, +0.12, −0.06 sd — the accuracy criterion holds on seed 2 only."""
    model, guide, x, y = _elbo_fit(VI_GUIDE, seed)
    result = pi.fit(model, guide, (x, y), seed=seed, progress=False, **VI_REFINE)
    assert result.config.elbo == "iwae"
    lam = symmetry_draws(model, guide, x, y, num_samples=VI_DRAWS, seed=seed)["lam"].double().numpy()
    ratio = lam.std(ddof=1) / exact_lambda.sd
    assert 0.72 < ratio < 1.1, ratio  # the ELBO's 0.6 is out
    assert abs(lam.mean() - exact_lambda.mean) < 0.25 * exact_lambda.sd


# the ELBO fit, then reweighted wake-sleep with K = 256 (the CHOSEN of
# research/uncertain_symmetry/scripts/symmetry_posterior_basis.py, chosen there from a K sweep on seeds 0-2 and
# confirmed on seeds 3-5)
VI_RWS = {**VI_REFINE, "elbo": "rws", "num_particles": 256}


@pytest.mark.parametrize("seed", VI_SEEDS)
def test_rws_refinement_meets_the_accuracy_criterion(seed, exact_lambda):
    """The accuracy criterion, "the variational q(λ) mean within 0.1·sd and sd within 25 % of the exact
    quadrature posterior": met once the full-rank ELBO fit is continued by reweighted wake-sleep
    (``elbo="rws"``), whose guide update follows the inclusive KL(p ‖ q) and so widens q towards the
    heavy-tailed posterior's sd instead of staying inside it. Measured
    (research/uncertain_symmetry/results/symmetry_posterior_basis.md): mean errors −0.00 to +0.02 sd, sd ratios
    0.79-0.84 on seeds 0-2 and 0.81-0.84 on the held-out seeds 3-5."""
    model, guide, x, y = _elbo_fit(VI_GUIDE, seed)
    result = pi.fit(model, guide, (x, y), seed=seed, progress=False, **VI_RWS)
    assert result.config.elbo == "rws"
    lam = symmetry_draws(model, guide, x, y, num_samples=VI_DRAWS, seed=seed)["lam"].double().numpy()
    assert abs(lam.mean() - exact_lambda.mean) < 0.1 * exact_lambda.sd
    assert abs(lam.std(ddof=1) / exact_lambda.sd - 1.0) < 0.25


# ------------------------------------------------------------------------------------------------
# the NUTS reference with η latent on rotated digits


def test_invariant_mlp_eta_reference_concentrates_at_large_rotation():
    """The digits are rotated: the joint NUTS posterior of the rotation range puts η near the full
    circle. Stored draws (4×600): mean 2.79, sd 0.27, median 2.84, 95 % interval [2.18, 3.12],
    P(η < 2) = 0.015, no draw below 1; the four chains' means 2.77–2.81. (R-hat / ESS of every
    scalar, η's included, are checked by tests/diagnostics/test_reference.py.)"""
    ref = load_reference("invariant-mlp-digits-eta")
    d = ref.metadata["diagnostics"]["sites"]["eta"]
    assert d["rhat_max"] < 1.01 and d["ess_bulk_min"] > 400
    eta = ref.draws["eta"].astype(np.float64)
    assert eta.shape[2:] == (1,)
    assert np.all((eta > 0) & (eta < math.pi))
    assert eta.mean() > 2.0
    assert np.mean(eta > 2.0) > 0.95 and np.mean(eta < 1.0) < 0.01
    assert np.ptp(eta.mean(axis=(1, 2))) < 0.5 * eta.std()  # every chain found the same region
    model, _, _ = ref.entry.build()
    assert model.symmetry_sites() == ["eta"] and not model.symmetry_summary()
