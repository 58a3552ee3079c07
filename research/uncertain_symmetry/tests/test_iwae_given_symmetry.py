"""``elbo="iwae-given-symmetry"``: an ELBO in the symmetry latent, the IWAE bound in the other latents given
it. One draw of η is shared by the K particles, K = 1 is the ELBO, the bound rises with K towards
E_q(λ)[log p(D | λ) + log p(λ) − log q(λ)] (the exact evidence of basis regression), and guides or models
that cannot share a draw are refused. The guide's evidence profile at fixed λ (:func:`guide_evidence_profile`) is exact
with the exact conditional posterior as guide, and a bound below it otherwise."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry  # noqa: E402
from pyro_invariance.infer.config import FitConfig  # noqa: E402
from pyro_invariance.infer.fast_step import LeanTrace_ELBO  # noqa: E402
from pyro_invariance.infer.training import set_up_guide  # noqa: E402
from research.uncertain_symmetry.evidence_profile import guide_evidence_profile  # noqa: E402
from research.uncertain_symmetry.iwae_given_symmetry import LeanIWAEGivenSymmetry_ELBO, _FirstDraw  # noqa: E402

SHARING_GUIDES = ("mean-field", "symmetry-conditional")


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _basis(guide_name: str, steps: int = 0, seed: int = 0):
    """Basis regression with λ latent (the reference entry: U(0, 2) prior, 60 points), its guide set up
    and, with ``steps``, fitted by the ELBO (full batch)."""
    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get(guide_name, model)
    set_up_guide(model, guide, x[:2], y[:2], num_data=x.shape[0])
    if steps:
        pi.fit(model, guide, (x, y), seed=seed, progress=False, steps=steps, batch_size=None)
    return model, guide, x, y


def _loss(K: int) -> LeanIWAEGivenSymmetry_ELBO:
    vector = {"vectorize_particles": True, "max_plate_nesting": 1} if K > 1 else {}
    return LeanIWAEGivenSymmetry_ELBO(num_particles=K, shared_sites=["lam"], **vector)


@pytest.mark.parametrize("guide_name", SHARING_GUIDES)
def test_one_draw_of_lambda_is_shared_by_vectorised_and_sequential_particles(guide_name) -> None:
    model, guide, x, y = _basis(guide_name)
    n = x.shape[0]
    vectorised = _loss(8)._vectorized_num_particles(_FirstDraw(["lam"])(guide))
    tr = poutine.trace(vectorised).get_trace(x, y, num_data=n)
    tr.compute_log_prob()
    lam, weight = tr.nodes["lam"], tr.nodes["weight"]
    assert lam["value"].numel() == 1  # one draw, broadcast over the particles
    assert lam["log_prob"].shape == (8, 1) and torch.isfinite(lam["log_prob"]).all()
    assert torch.unique(lam["log_prob"]).numel() == 1
    w = weight["value"].reshape(8, -1)
    assert not torch.allclose(w[0], w[1])  # the weights are drawn per particle
    shared = _FirstDraw(["lam"])(guide)  # sequential particles: one messenger across the calls
    traces = [poutine.trace(shared).get_trace(x, y, num_data=n) for _ in range(3)]
    assert all(torch.equal(t.nodes["lam"]["value"], traces[0].nodes["lam"]["value"]) for t in traces)
    assert not torch.equal(traces[0].nodes["weight"]["value"], traces[1].nodes["weight"]["value"])


@pytest.mark.parametrize("guide_name", SHARING_GUIDES)
def test_one_particle_is_the_elbo(guide_name) -> None:
    model, guide, x, y = _basis(guide_name, steps=50)
    n = x.shape[0]
    for seed in range(3):
        pyro.set_rng_seed(seed)
        elbo = LeanTrace_ELBO().differentiable_loss(model, guide, x, y, num_data=n)
        pyro.set_rng_seed(seed)
        given = _loss(1).differentiable_loss(model, guide, x, y, num_data=n)
        assert given.item() == pytest.approx(elbo.item(), rel=1e-5, abs=1e-4)


def _log_weight_of_lambda(model, guide, x, y, num: int) -> torch.Tensor:
    """``num`` draws of log p(D | λ) + log p(λ) − log q(λ), λ ~ q(λ), with the exact evidence of basis
    regression: the K → ∞ limit of the bound for this guide (q(λ) of the sites ``lam`` / ``lam_aux``)."""
    n, out = x.shape[0], []
    with torch.no_grad():
        for _ in range(num):
            tr = poutine.trace(guide).get_trace(x, y, num_data=n)
            tr.compute_log_prob()
            log_q = sum(tr.nodes[s]["log_prob"].sum() for s in ("lam", "lam_aux") if s in tr.nodes)
            lam = tr.nodes["lam"]["value"]
            mt = poutine.trace(poutine.replay(model, trace=tr)).get_trace(x, y, num_data=n)
            mt.compute_log_prob()
            out.append(model.log_evidence(x, y, lam) + mt.nodes["lam"]["log_prob"].sum() - log_q)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in out])


@pytest.mark.parametrize("guide_name", SHARING_GUIDES)
def test_bound_rises_with_k_and_stays_below_its_exact_limit(guide_name) -> None:
    """E[L_K] ≤ E[L_{K'}] for K ≤ K' (Burda et al. 2016, Thm. 1, for each λ) and every E[L_K] ≤
    E_q(λ)[log p(D | λ) + log p(λ) − log q(λ)] (Jensen, for each λ), computed with the exact evidence."""
    model, guide, x, y = _basis(guide_name, steps=300)
    n, reps = x.shape[0], 200
    pyro.set_rng_seed(1)
    means, ses = {}, {}
    for K in (1, 16, 256):
        with torch.no_grad():
            v = torch.stack(
                [-_loss(K).differentiable_loss(model, guide, x, y, num_data=n) for _ in range(reps)]
            ).double()
        means[K], ses[K] = v.mean().item(), v.std().item() / math.sqrt(reps)
    limit_draws = _log_weight_of_lambda(model, guide, x, y, 2000)
    limit, limit_se = limit_draws.mean().item(), limit_draws.std().item() / math.sqrt(len(limit_draws))
    assert means[1] + 3 * ses[1] < means[16] and means[16] + 3 * ses[16] < means[256], (means, ses)
    assert means[256] < limit + 4 * math.hypot(ses[256], limit_se), (means, limit, limit_se)


def test_a_guide_that_draws_lambda_jointly_is_refused() -> None:
    model, guide, x, y = _basis("full-rank")
    with pytest.raises(ValueError, match="draws the symmetry site 'lam' on its own") as err:
        pi.fit(
            model, guide, (x, y), steps=2, batch_size=None, progress=False, elbo="iwae-given-symmetry", num_particles=4
        )
    assert "\n" not in str(err.value)


def test_a_model_without_a_latent_symmetry_is_refused() -> None:
    model, x, y = entry("basis-regression").build()
    guide = guides.get("mean-field", model)
    assert model.symmetry_sites() == []
    with pytest.raises(ValueError, match="needs a latent symmetry"):
        pi.fit(
            model, guide, (x, y), steps=2, batch_size=None, progress=False, elbo="iwae-given-symmetry", num_particles=4
        )


def test_fit_trains_with_it_and_the_config_names_it() -> None:
    model, guide, x, y = _basis("symmetry-conditional", steps=100)
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    result = pi.fit(
        model,
        guide,
        (x, y),
        seed=0,
        steps=20,
        batch_size=None,
        progress=False,
        lr=0.005,
        elbo="iwae-given-symmetry",
        num_particles=8,
    )
    assert FitConfig(elbo="iwae-given-symmetry").elbo == result.config.elbo == "iwae-given-symmetry"
    after = guide.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if "lam" in k)  # q(λ) is trained
    assert all(math.isfinite(v) for v in result.history["elbo"])


# ------------------------------------------------------------------------------------------------
# guide_evidence_profile


def _exact_conditional_guide(model):
    """A guide whose q(weight | λ) is the exact Gaussian posterior p(weight | D, λ) of basis regression
    (q(λ) any density inside the support): every importance weight at fixed λ is p(D | λ)."""

    def guide(x, y, num_data=None):
        lam = pyro.sample("lam", dist.Uniform(0.05, 1.95))
        phi, chol, yy = model._exact(x, y, lam)
        mean = torch.cholesky_solve(phi.T @ yy / model.noise_scale**2, chol)  # (F, D_out)
        scale_tril = torch.linalg.cholesky(torch.cholesky_inverse(chol))
        pyro.sample(
            "weight", dist.MultivariateNormal(mean.T.to(x.dtype), scale_tril=scale_tril.to(x.dtype)).to_event(1)
        )

    return guide


def test_profile_of_the_exact_conditional_guide_is_the_exact_evidence() -> None:
    model, x, y = entry("basis-regression-lambda").build()
    lams = [0.3, 1.0, 1.7]
    for K in (1, 8):
        prof = guide_evidence_profile(model, _exact_conditional_guide(model), x, y, lams, K=K, seed=K)
        exact = torch.stack([model.log_evidence(x, y, torch.tensor(v, dtype=torch.float64)) for v in lams])
        assert prof.dtype == torch.float64 and prof.shape == (3,)
        assert torch.allclose(prof, exact, atol=2e-3 * x.shape[0]), (prof, exact)  # float32 sums of 60 terms


def test_profile_of_a_fitted_guide_rises_with_k_below_the_exact_evidence() -> None:
    model, guide, x, y = _basis("symmetry-conditional", steps=300)
    lams = [0.4, 1.0, 1.6]
    exact = torch.stack([model.log_evidence(x, y, torch.tensor(v, dtype=torch.float64)) for v in lams])
    low = guide_evidence_profile(model, guide, x, y, lams, K=1, repeats=100, seed=0)
    high = guide_evidence_profile(model, guide, x, y, lams, K=256, repeats=20, seed=0)
    assert (low < high).all() and (high < exact + 0.5).all(), (low, high, exact)
    assert torch.equal(
        guide_evidence_profile(model, guide, x, y, lams, K=16, seed=3),
        guide_evidence_profile(model, guide, x, y, lams, K=16, seed=3),
    )  # seeded


def test_profile_refuses_boundary_values_and_models_without_a_latent_symmetry() -> None:
    model, guide, x, y = _basis("mean-field")
    with pytest.raises(ValueError, match="strictly inside the support"):
        guide_evidence_profile(model, guide, x, y, [0.0, 1.0], K=2)
    plain, xp, yp = entry("basis-regression").build()
    with pytest.raises(ValueError, match="one latent symmetry site"):
        guide_evidence_profile(plain, guides.get("mean-field", plain), xp, yp, [1.0], K=2)


@pytest.mark.parametrize(
    "options", [{}, {"weight_covariance": "mvn"}, {"symmetry_density": "spline"}], ids=["normal", "mvn", "spline"]
)
def test_profile_reads_the_symmetry_conditional_guide_at_the_held_lambda(options) -> None:
    """The symmetry-conditional guide draws θ through η's noise (``B (u_λ − m_λ)``): holding λ must set that
    noise, so that the draw of λ is λ_j and θ's location is m_θ + B (u_j − m_λ) (a regression: the noise
    was once set to u_j itself, which reads q(θ | λ) near q(λ)'s location whatever λ_j is)."""
    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get("symmetry-conditional", model, **options)
    set_up_guide(model, guide, x[:2], y[:2], num_data=x.shape[0])
    with torch.no_grad():
        guide.locs.lam_unconstrained.fill_(-1.2)
        if "symmetry_density" not in options:
            guide.scales.lam_unconstrained.fill_(math.log(math.expm1(0.3)))  # softplus⁻¹(0.3)
        guide.deps.weight.lam.weight.copy_(torch.linspace(-2.0, 2.0, 8)[:, None])
        guide.scales.weight_unconstrained.fill_(-30.0)  # θ's own noise ≈ 0: its draw is its location
    for lam in (0.2, 1.0, 1.8):
        value = torch.tensor(lam)
        tr = poutine.trace(poutine.condition(guide, data=guide.symmetry_condition("lam", value))).get_trace(x, y)
        assert torch.allclose(tr.nodes["lam"]["value"], value, atol=1e-5)
        u = torch.logit(value / 2.0)  # λ ∈ (0, 2)
        expected = guide.locs.weight + guide.deps.weight.lam.weight[:, 0] * (u - guide.locs.lam)
        assert torch.allclose(tr.nodes["weight"]["value"], expected.detach(), atol=1e-4), lam
    full = guides.get("full-rank", model)
    set_up_guide(model, full, x[:2], y[:2], num_data=x.shape[0])
    with pytest.raises(ValueError, match="no parameters of its own"):
        full.symmetry_condition("lam", torch.tensor(1.0))
