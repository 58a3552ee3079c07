"""Evidence bounds against the exact evidence of BasisRegression.

For every guide and K: ELBO ≤ IWAE_K ≤ log p(D) within Monte-Carlo error, and IWAE_K approaches
log p(D) as K grows. Bad input (K ≤ 0, a model that observes nothing) gives a clear error.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.infer.bounds import (
    check_observed,
    elbo_bound,
    evidence_bounds,
    iwae_bound,
    iwae_from_log_weights,
    log_weights,
    psis_khat,
    validate_K,
)
from pyro_invariance.models.basis_regression import make_symmetric_toy

torch.set_num_threads(1)

N = 40
KS = (10, 100, 1000)
#: every guide that is a density (map is a point mass, tested separately); full-batch SVI steps each
GUIDES = ("mean-field", "low-rank", "full-rank", "matrix-normal", "block-cholesky")
STEPS = 150  # partly fitted (SVI from init_scale 0.1): the bounds hold for any guide


@pytest.fixture(scope="module")
def toy():
    return make_symmetric_toy(N, seed=3, noise=0.3, even=True, num_outputs=3)


def _model():
    # rbf features with strongly correlated neighbours: mean-field cannot represent the posterior
    return pi.models.get(
        "basis-regression",
        in_features=1,
        out_features=3,
        num_features=8,
        lengthscale=0.6,
        prior_scale=0.5,
        noise_scale=0.3,
        eta_init=1.0,
        learn_symmetry=False,
    )


@pytest.fixture(scope="module")
def fitted(toy):
    """(log Z, EvidenceBounds) per guide, each fitted full-batch from the same seed."""
    x, y = toy
    out = {}
    for name in GUIDES:
        model = _model()
        guide = guides.get(name, model, init_scale=0.1)
        pi.fit(model, guide, (x, y), steps=STEPS, batch_size=None, lr=0.1, factor_lr=0.1, progress=False, seed=1)
        pyro.set_rng_seed(2)
        # BasisRegression broadcasts over particles: 3000 draws (3 independent IWAE_1000 estimates,
        # hence a standard error whatever k̂) in vectorised passes of 100
        bounds = evidence_bounds(model, guide, x, y, KS, num_samples=3000, vectorize=True)
        out[name] = (float(model.log_evidence(x, y)), bounds, model, guide)
    return out


@pytest.mark.parametrize("name", GUIDES)
def test_elbo_below_iwae_below_log_evidence(fitted, name):
    log_z, b, _, _ = fitted[name]
    assert b.elbo.is_bound and not b.point_estimate and b.num_samples == 3000
    for k in KS:
        iw = b.iwae[k]
        assert iw.K == k and iw.num_data == N and iw.per_datum == pytest.approx(iw.value / N)
        assert b.elbo.value <= iw.value + 3 * iw.stderr + 1e-3, (name, k, b.elbo.value, iw.value, iw.stderr)
        assert iw.value <= log_z + 3 * iw.stderr + 1e-3, (name, k, iw.value, iw.stderr, log_z)
    assert b.elbo.value <= log_z + 3 * b.elbo.stderr
    # IWAE_1000 is closer to the evidence than the ELBO
    assert abs(log_z - b.iwae[1000].value) < log_z - b.elbo.value, (name, log_z, b.elbo.value, b.iwae[1000].value)


def test_mean_field_gap_shrinks_with_K(fitted):
    log_z, b, _, _ = fitted["mean-field"]
    gaps = [log_z - b.elbo.value] + [log_z - b.iwae[k].value for k in KS]
    assert gaps[0] > 5.0, gaps  # mean-field is clearly worse than the evidence here
    for a, c, k in zip(gaps, gaps[1:], KS):
        assert c < a, (k, gaps)
    assert gaps[-1] < 0.75 * gaps[0], gaps
    assert b.k_hat > 0.7 and "k̂ > 0.7" in b.note  # and PSIS says the proposal is poor


def test_single_heavy_tailed_estimate_has_no_error(fitted):
    """One IWAE_K estimate from weights with k̂ > 0.7: the delta method's ±1 nat would be a lie."""
    _, b, _, _ = fitted["mean-field"]
    one = iwae_from_log_weights(b.log_weights[:1000], 1000, N, k_hat=b.k_hat)
    assert b.k_hat > 0.7 and math.isnan(one.stderr)
    three = iwae_from_log_weights(b.log_weights, 1000, N, k_hat=b.k_hat)
    assert three.num_samples == 3000 and math.isfinite(three.stderr)


def test_structured_guides_reach_the_evidence(fitted):
    # rows of the weight are independent a posteriori, with a shared covariance: block-Cholesky and
    # matrix-normal can represent the posterior, so their IWAE_1000 sits at log Z
    mean_field_gap = fitted["mean-field"][0] - fitted["mean-field"][1].iwae[1000].value
    for name in ("block-cholesky", "matrix-normal"):
        log_z, b, _, _ = fitted[name]
        assert abs(log_z - b.iwae[1000].value) < min(1.0, mean_field_gap / 4), (name, log_z, b.iwae[1000].value)


def test_vectorised_and_sequential_draws_agree(fitted, toy):
    x, y = toy
    _, _, model, guide = fitted["matrix-normal"]
    pyro.set_rng_seed(3)
    seq = evidence_bounds(model, guide, x, y, (10,), num_samples=200)
    pyro.set_rng_seed(3)
    vec = evidence_bounds(model, guide, x, y, (10,), num_samples=200, vectorize=True, particle_chunk=64)
    assert seq.num_samples == vec.num_samples == 200
    for a, b in ((seq.elbo, vec.elbo), (seq.iwae[10], vec.iwae[10])):
        assert abs(a.value - b.value) < 4 * math.hypot(a.stderr, b.stderr), (a, b)


def test_exact_posterior_guide_gives_log_evidence(toy):
    """A full-rank guide set to the exact posterior: every weight equals log Z, so every bound does."""
    x, y = toy
    model = _model()
    guide = guides.get("full-rank", model)
    guide(x, y)
    mean, cov = model.posterior(x, y)
    chol = torch.block_diag(*[torch.linalg.cholesky(cov)] * mean.shape[0])  # rows of W independent
    diag = chol.diagonal()
    with torch.no_grad():
        guide.loc.copy_(mean.flatten())
    guide.scale = diag.float()
    guide.scale_tril = (chol / diag.unsqueeze(-1)).float()
    log_z = float(model.log_evidence(x, y))
    b = evidence_bounds(model, guide, x, y, (10, 100), num_samples=200, vectorize=True)
    assert b.elbo.value == pytest.approx(log_z, abs=2e-3)
    assert b.elbo.stderr < 1e-3
    for k in (10, 100):
        assert b.iwae[k].value == pytest.approx(log_z, abs=2e-3)


def test_iwae_matches_pyro_renyi_elbo_alpha_0(fitted, toy):
    """Our IWAE_10 and Pyro's RenyiELBO(alpha=0, num_particles=10) estimate the same bound."""
    x, y = toy
    _, _, model, guide = fitted["mean-field"]
    pyro.set_rng_seed(5)
    ours = iwae_bound(model, guide, x, y, 10, num_estimates=100, vectorize=True)
    renyi = pyro.infer.RenyiELBO(alpha=0.0, num_particles=10, vectorize_particles=True, max_plate_nesting=1)
    theirs = torch.tensor([-renyi.loss(model, guide, x, y) for _ in range(100)], dtype=torch.float64)
    se = math.hypot(ours.stderr, float(theirs.std()) / 10)
    assert abs(ours.value - float(theirs.mean())) < 4 * se, (ours.value, float(theirs.mean()), se)
    # and the ELBO of elbo_bound matches Pyro's Trace_ELBO (Monte-Carlo KL) on the same guide
    pyro.set_rng_seed(6)
    e = elbo_bound(model, guide, x, y, num_particles=500, vectorize=True)
    trace_elbo = pyro.infer.Trace_ELBO(num_particles=25, vectorize_particles=True, max_plate_nesting=1)
    theirs = torch.tensor([-trace_elbo.loss(model, guide, x, y) for _ in range(20)], dtype=torch.float64)
    se = math.hypot(e.stderr, float(theirs.std()) / math.sqrt(20))
    assert abs(e.value - float(theirs.mean())) < 4 * se, (e.value, float(theirs.mean()), se)


def test_map_guide_is_flagged_not_a_bound(toy):
    x, y = toy
    model = _model()
    guide = guides.get("map", model)
    pi.fit(model, guide, (x, y), steps=50, batch_size=None, progress=False, seed=1)
    b = evidence_bounds(model, guide, x, y, KS)
    assert b.point_estimate and not b.elbo.is_bound and math.isnan(b.k_hat)
    assert all(not v.is_bound and v.K == k and "not a bound" in v.note for k, v in b.iwae.items())
    assert b.num_samples <= 16  # a point mass needs no 1000 draws
    # the log joint at the point: equal for every K
    assert len({round(v.value, 6) for v in b.iwae.values()}) == 1


def _khat_reference(lw):
    """An independent k̂: Pyro's generalised-Pareto fit (Zhang & Stephens) to the excess of the
    largest ``ceil(min(S/5, 3√S))`` weights over the next one (PSIS, Vehtari et al. 2017)."""
    from pyro.ops.stats import fit_generalized_pareto

    lw = torch.sort(lw - lw.max())[0]
    m = math.ceil(min(0.2 * lw.numel(), 3 * math.sqrt(lw.numel())))
    cutoff = lw[-m - 1]
    return float(fit_generalized_pareto(lw[-m:].exp() - cutoff.exp())[0])


def test_psis_khat_is_arviz_and_matches_an_independent_fit():
    from pyro_invariance.infer.psis import arviz_khat

    gen = torch.Generator().manual_seed(0)
    for sd in (0.5, 2.0, 3.0):
        lw = sd * torch.randn(2000, generator=gen, dtype=torch.float64)
        ours = psis_khat(lw)
        assert ours == arviz_khat(lw.numpy())  # ArviZ's number, unchanged
        assert ours == pytest.approx(_khat_reference(lw), abs=0.05), sd
    light, heavy = psis_khat(0.3 * torch.randn(2000, generator=gen)), psis_khat(3.0 * torch.randn(2000, generator=gen))
    assert light < 0.5 < 0.7 < heavy


def test_psis_khat_zero_weights_are_kept():
    lw = torch.randn(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lw[::7] = -math.inf  # draws where p = 0: weight 0, in the body, not the tail
    k = psis_khat(lw)
    assert math.isfinite(k) and k < 0.5


@pytest.mark.parametrize(
    "case, expected, warns",
    [
        ("constant", -math.inf, None),  # q ∝ posterior: exact proposal
        ("constant_large", -math.inf, None),  # log joint ≈ −1e4, equal up to float rounding
        ("constant_with_zeros", -math.inf, None),
        ("nan", math.nan, "NaN"),
        ("posinf", math.inf, r"\+inf"),
        ("all_neginf", math.nan, "-inf"),
        ("too_few", math.nan, "too few"),
        ("one_dominates", math.inf, None),  # fewer than 10 weights within 1e-15 of the largest
        ("few_tied_dominate", math.inf, None),
        ("top_ties", -math.inf, None),  # bounded weights: the whole tail is the maximum
    ],
)
def test_psis_khat_degenerate_weights(case, expected, warns):
    gen = torch.Generator().manual_seed(2)
    lw = {
        "constant": torch.zeros(100),
        "constant_large": -1e4 + 1e-9 * torch.randn(100, generator=gen, dtype=torch.float64),
        "constant_with_zeros": torch.tensor([0.0] * 80 + [-math.inf] * 20),
        "nan": torch.cat([torch.randn(99, generator=gen), torch.tensor([math.nan])]),
        "posinf": torch.cat([torch.randn(99, generator=gen), torch.tensor([math.inf])]),
        "all_neginf": torch.full((100,), -math.inf),
        "too_few": torch.randn(20, generator=gen),
        "one_dominates": torch.tensor([-100.0] * 99 + [0.0]),
        "few_tied_dominate": torch.tensor([-100.0] * 95 + [0.0] * 5),
        "top_ties": torch.tensor([0.0] * 50 + [1.0] * 50),
    }[case]
    if warns is None:
        k = psis_khat(lw)
    else:
        with pytest.warns(UserWarning, match=warns):
            k = psis_khat(lw)
    assert (math.isnan(k) and math.isnan(expected)) or k == expected
    with pytest.raises(ValueError, match="at least one"):
        psis_khat(torch.zeros(0))


# ------------------------------------------------------------------------------------------------
# bad input


class _NoObservation(PyroModule):
    """A model with a latent but no observed site: nothing to bound."""

    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None, num_data=None):
        return x @ self.w


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10", None])
def test_bad_K_is_a_clear_error(toy, bad):
    x, y = toy
    model = _model()
    guide = guides.get("mean-field", model)
    with pytest.raises(ValueError, match="K must be an integer >= 1"):
        iwae_bound(model, guide, x, y, bad)
    with pytest.raises(ValueError, match="K must be an integer >= 1"):
        evidence_bounds(model, guide, x, y, (10, bad))
    with pytest.raises(ValueError, match="K must be an integer >= 1"):
        validate_K(bad)


def test_other_bad_input(toy):
    x, y = toy
    model = _model()
    guide = guides.get("mean-field", model)
    with pytest.raises(ValueError, match="smaller than the largest K"):
        evidence_bounds(model, guide, x, y, (10, 100), num_samples=50)
    with pytest.raises(ValueError, match="y is required"):
        elbo_bound(model, guide, x, None)
    with pytest.raises(ValueError, match="same, non-zero number of rows"):
        log_weights(model, guide, x, y[:5], 3)


def test_model_without_observed_site_is_a_clear_error():
    x, y = torch.randn(10, 1), torch.randn(10)
    model = _NoObservation()
    guide = guides.get("mean-field", model)
    with pytest.raises(ValueError, match="no observed sample site"):
        check_observed(model, x, y)
    with pytest.raises(ValueError, match="no observed sample site"):
        iwae_bound(model, guide, x, y, 10)
