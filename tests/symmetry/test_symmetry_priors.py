"""η as a latent variable (``symmetry_prior``): priors, model contract, guides, training, ArviZ, tables."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from scipy import integrate

import pyro_invariance as pi
from pyro_invariance.diagnostics.plots import model_figures
from pyro_invariance.diagnostics.symmetry_posterior import symmetry_draws
from pyro_invariance.models import get
from pyro_invariance.models.basis_regression import make_symmetric_toy
from pyro_invariance.symmetry.priors import (
    LOGIT_NORMAL_SCALE,
    ScaledLogitNormal,
    bounded_prior,
    check_symmetry_prior,
    unbounded_prior,
)

matplotlib.use("Agg")

#: model name -> (kwargs with a latent η, data, symmetry sites, their supports' upper bound or None)
CASES = {
    "invariant-mlp": (
        dict(symmetry_prior="uniform", hidden=16, num_transforms=2),
        lambda: (torch.rand(12, 1, 8, 8), torch.randint(0, 10, (12,))),
        ["eta"],
        math.pi,
    ),
    "rotation-toy-2d": (
        dict(symmetry_prior="logit-normal", hidden=8),
        lambda: (torch.randn(12, 2), torch.randint(0, 2, (12,))),
        ["eta"],
        math.pi,
    ),
    "basis-regression": (
        dict(symmetry_prior="uniform"),
        lambda: (torch.randn(12, 1), torch.randn(12, 1)),
        ["lam"],
        2.0,
    ),
    "symmetrised-hnn": (
        dict(symmetry_prior="normal", hidden=(8, 8), num_transforms=2),
        lambda: (torch.randn(12, 2), torch.randn(12, 2)),
        ["eta_W", "eta_b"],
        None,
    ),
}


# -- priors ---------------------------------------------------------------------------------------
def test_scaled_logit_normal_density_and_support():
    upper = torch.tensor(math.pi, dtype=torch.float64)
    fn = bounded_prior("logit-normal", upper)
    eta = torch.tensor([0.3, 1.5, 3.0], dtype=torch.float64)
    u = eta / upper
    z = torch.log(u / (1 - u))
    # change of variables: p(η) = N(z; 0, s) / (η_max u (1 − u))
    expected = torch.distributions.Normal(0.0, LOGIT_NORMAL_SCALE).log_prob(z) - torch.log(upper * u * (1 - u))
    torch.testing.assert_close(fn.log_prob(eta), expected)
    assert fn.support.check(eta).all() and not fn.support.check(torch.tensor(3.2, dtype=torch.float64))
    total, _ = integrate.quad(lambda v: math.exp(float(fn.log_prob(torch.tensor(v, dtype=torch.float64)))), 0, math.pi)
    assert total == pytest.approx(1.0, abs=1e-6)
    assert isinstance(fn.expand([3]), ScaledLogitNormal) and fn.expand([3]).batch_shape == (3,)


def test_bounded_and_unbounded_priors():
    upper = torch.tensor([math.pi, 0.5])
    fn = bounded_prior("uniform", upper)
    assert fn.event_shape == (2,) and fn.support.check(torch.tensor([3.0, 0.4])).all()
    torch.testing.assert_close(fn.log_prob(torch.tensor([1.0, 0.2])), -torch.log(upper).sum())
    g = unbounded_prior("normal", (2, 3), torch.zeros((), dtype=torch.float64))
    assert g.event_shape == (2, 3) and g.sample().dtype == torch.float64
    with pytest.raises(ValueError, match="unknown bounded symmetry prior"):
        bounded_prior("normal", upper)
    with pytest.raises(ValueError, match="unknown symmetry_prior 'cauchy'"):
        check_symmetry_prior("cauchy", ("uniform",), "M")


# -- the model contract ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_latent_symmetry_is_a_sample_site_with_the_declared_prior(name):
    kwargs, data, sites, upper = CASES[name]
    model = get(name, **kwargs)
    x, y = data()
    trace = poutine.trace(model).get_trace(x, y)
    assert model.symmetry_sites() == sites
    assert model.symmetry_parameters() == []  # nothing for eta_lr: q(η) lives in the guide
    assert model.symmetry_summary() == {}  # no value outside a trace
    for site in sites:
        node = trace.nodes[site]
        assert node["type"] == "sample" and not node["is_observed"]
        if upper is not None:
            support = node["fn"].support
            assert support.check(node["value"]).all()
            support = getattr(support, "base_constraint", support)
            assert float(torch.as_tensor(support.upper_bound).max()) == pytest.approx(upper)
    # the point-estimate model has no such site
    point = get(name, **{k: v for k, v in kwargs.items() if k != "symmetry_prior"})
    assert point.symmetry_sites() == []
    assert not set(sites) & set(poutine.trace(point).get_trace(x, y).stochastic_nodes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_symmetry_prior_errors_are_one_line(name):
    kwargs, *_ = CASES[name]
    with pytest.raises(ValueError, match="learn_symmetry=False fixes it"):
        get(name, **kwargs, learn_symmetry=False)
    with pytest.raises(ValueError, match="unknown symmetry_prior 'wide'"):
        get(name, **{**kwargs, "symmetry_prior": "wide"})


def test_hnn_symmetry_prior_needs_learned_generators():
    with pytest.raises(ValueError, match="symmetry_prior needs symmetry='quadratic'"):
        get("symmetrised-hnn", symmetry="so2", symmetry_prior="normal")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("guide_name", ["mean-field", "full-rank", "symmetry-conditional", "map"])
def test_fit_with_a_latent_symmetry_records_the_guides_median(name, guide_name):
    kwargs, data, sites, _ = CASES[name]
    model = get(name, **kwargs)
    guide = pi.guides.get(guide_name, model)
    result = pi.fit(model, guide, data(), steps=3, progress=False)
    assert all(math.isfinite(v) for v in result.history["elbo"])
    assert result.eta and set(result.eta) == set(result.history["eta"])
    assert all(len(v) == 3 for v in result.history["eta"].values())
    with pi.pyro_scope():
        median = guide.median()
    assert set(sites) <= set(median)
    assert result.eta == {k: float(v) for k, v in model.symmetry_summary({s: median[s] for s in sites}).items()}


def test_resume_with_a_latent_symmetry_is_bit_for_bit(tmp_path):
    kwargs, data, *_ = CASES["invariant-mlp"]
    xy = data()

    def run(**kw):
        model = get("invariant-mlp", **kwargs)
        guide = pi.guides.get("mean-field", model)
        return pi.fit(model, guide, xy, steps=6, batch_size=4, progress=False, **kw)

    full = run()
    path = tmp_path / "c.pt"
    run(checkpoint_path=path, until_step=3)
    resumed = run(checkpoint_path=path, resume=True)
    assert resumed.history["elbo"] == full.history["elbo"]
    assert resumed.history["eta"] == full.history["eta"]


# -- basis regression: vectorised particles and the exact evidence of the whole model ------------------------
def test_basis_regression_latent_lambda_vectorises_over_particles():
    model = get("basis-regression", symmetry_prior="uniform", num_features=6)
    guide = pi.guides.get("mean-field", model)
    x, y = make_symmetric_toy(15, seed=1)
    elbo = pyro.infer.Trace_ELBO(num_particles=5, vectorize_particles=True, max_plate_nesting=1)
    with pi.pyro_scope():
        loss = elbo.loss(model, guide, x, y)
        trace = poutine.trace(guide).get_trace(x, y)
        # one particle by replay equals the vectorised model on the same value
        single = poutine.trace(poutine.replay(model, trace)).get_trace(x, y)
    assert math.isfinite(loss)
    assert single.nodes["_RETURN"]["value"].shape == (15, 1)


def test_basis_regression_log_marginal_evidence_matches_scipy_quadrature():
    x, y = make_symmetric_toy(20, seed=0, noise=0.3, even=False)
    for prior in ("uniform", "logit-normal"):
        model = get("basis-regression", num_features=8, lengthscale=0.6, noise_scale=0.3, symmetry_prior=prior)
        fn = bounded_prior(prior, torch.tensor(2.0, dtype=torch.float64))
        shift = float(model.log_evidence(x, y, lam=1.0))

        def integrand(lams: np.ndarray) -> np.ndarray:  # one exact evidence per node, no batching
            values = [torch.tensor(v, dtype=torch.float64) for v in lams]
            return np.array(
                [math.exp(float(model.log_evidence(x, y, lam=v)) - shift + float(fn.log_prob(v))) for v in values]
            )

        # Gauss–Legendre with 300 nodes: a different rule from the model's trapezoid on 2001 points
        reference = math.log(integrate.fixed_quad(integrand, 0.0, 2.0, n=300)[0]) + shift
        assert float(model.log_evidence(x, y)) == pytest.approx(reference, abs=1e-5)
    with pytest.raises(ValueError, match="λ is not latent"):
        get("basis-regression").log_evidence_grid(x, y)


# -- the structured guide -------------------------------------------------------------------------------
def test_symmetry_conditional_guide_learns_a_dependence_and_its_quantiles_are_marginal():
    x, y = make_symmetric_toy(30, seed=0, noise=0.3, even=False)
    model = get("basis-regression", num_features=6, lengthscale=0.6, noise_scale=0.3, symmetry_prior="uniform")
    guide = pi.guides.get("symmetry-conditional", model)
    result = pi.fit(model, guide, (x, y), steps=300, lr=0.02, progress=False)
    assert result.config.elbo == "trace"  # the guide's fit_defaults
    weight = guide.deps.weight.lam.weight
    assert weight.shape == (6, 1) and float(weight.abs().max()) > 1e-2  # q(θ | λ) depends on λ
    with pi.pyro_scope(), torch.no_grad():
        qs = guide.quantiles([0.1, 0.5, 0.9])
        torch.manual_seed(0)
        draws = torch.stack([guide()["weight"] for _ in range(4000)])
    empirical = torch.quantile(draws, torch.tensor([0.1, 0.5, 0.9]), dim=0)
    torch.testing.assert_close(qs["weight"], empirical, atol=0.08, rtol=0.0)


@pytest.mark.parametrize(
    "options",
    [
        {"symmetry_density": "spline"},
        {"weight_covariance": "mvn"},
        {"symmetry_density": "spline", "weight_covariance": "mvn"},
    ],
    ids=str,
)
def test_symmetry_conditional_options_quantiles_are_marginal(options):
    """A spline q(λ) (exact quantiles through the monotone flow) and a full covariance within each weight
    site (Pyro's "mvn"): after a short fit, the guide's quantiles of λ and of the weights match its draws."""
    x, y = make_symmetric_toy(30, seed=0, noise=0.3, even=False)
    model = get("basis-regression", num_features=6, lengthscale=0.6, noise_scale=0.3, symmetry_prior="uniform")
    guide = pi.guides.get("symmetry-conditional", model, init_scale=0.3, **options)
    pi.fit(model, guide, (x, y), steps=200, lr=0.02, progress=False, seed=1)
    if options.get("symmetry_density") == "spline":
        spline = guide.conds.lam.spline
        assert float(spline.unnormalized_widths.detach().abs().max()) > 1e-3  # the flow has moved off the identity
    with pi.pyro_scope(), torch.no_grad():
        qs = guide.quantiles([0.1, 0.5, 0.9])
        torch.manual_seed(0)
        draws = [guide() for _ in range(4000)]
    for site, atol in (("lam", 0.03), ("weight", 0.08)):
        empirical = torch.quantile(torch.stack([d[site] for d in draws]), torch.tensor([0.1, 0.5, 0.9]), dim=0)
        torch.testing.assert_close(qs[site].reshape(empirical.shape), empirical, atol=atol, rtol=0.0)


def test_symmetry_conditional_spline_starts_as_the_gaussian_guide():
    """The spline starts at the identity (uniform bins, unit slopes): before any step, q(λ)'s quantiles
    equal the Gaussian guide's."""
    x, y = make_symmetric_toy(30, seed=0, noise=0.3, even=False)
    quantiles = []
    for density in ("normal", "spline"):
        model = get("basis-regression", num_features=6, lengthscale=0.6, noise_scale=0.3, symmetry_prior="uniform")
        guide = pi.guides.get("symmetry-conditional", model, init_scale=0.3, symmetry_density=density)
        with pi.pyro_scope(), torch.no_grad():
            guide(x, y)
            quantiles.append(guide.quantiles([0.05, 0.3, 0.5, 0.95])["lam"])
    torch.testing.assert_close(quantiles[1], quantiles[0], atol=1e-5, rtol=0.0)


def test_symmetry_conditional_refuses_unknown_options():
    model = get("basis-regression", symmetry_prior="uniform")
    with pytest.raises(ValueError, match="unknown symmetry_density 'flow'"):
        pi.guides.get("symmetry-conditional", model, symmetry_density="flow")
    with pytest.raises(ValueError, match="unknown weight_covariance 'full'"):
        pi.guides.get("symmetry-conditional", model, weight_covariance="full")


def test_symmetry_conditional_guide_refuses_a_model_that_hides_its_sites():
    class Broken(type(get("basis-regression"))):
        def symmetry_sites(self):
            return ["nowhere"]

    guide = pi.guides.get("symmetry-conditional", Broken(symmetry_prior="uniform"))
    with pytest.raises(ValueError, match="does not sample"):
        guide(torch.randn(4, 1), torch.randn(4, 1))


# -- draws, ArviZ, tables ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted_mlp():
    data = pi.data.load_dataset("rotated-digits", train_size=60, test_size=30)
    model = get("invariant-mlp", symmetry_prior="uniform", hidden=16, num_transforms=4)
    guide = pi.guides.get("mean-field", model)
    return pi.fit(model, guide, data, steps=20, progress=False), data


def test_symmetry_draws_and_arviz(fitted_mlp):
    import arviz as az

    result, data = fitted_mlp
    x, y = data.x_train[:4], data.y_train[:4]
    draws = symmetry_draws(result.model, result.guide, x, y, num_samples=200, seed=3)
    assert draws["eta"].shape == (200, 1) and ((draws["eta"] > 0) & (draws["eta"] < math.pi)).all()
    again = symmetry_draws(result.model, result.guide, x, y, num_samples=200, seed=3)
    torch.testing.assert_close(draws["eta"], again["eta"])
    with pytest.raises(ValueError, match="no latent symmetry sites"):
        symmetry_draws(get("invariant-mlp", hidden=8), None, x, y)

    idata = pi.to_inference_data(result, data, num_samples=40)
    eta = idata.posterior["eta"]
    assert eta.dims == ("chain", "draw", "generator") and list(eta["generator"].values) == ["rot"]
    assert "constant_data" not in list(getattr(idata, "groups", lambda: [])())
    summary = az.summary(idata, var_names=["eta"], kind="stats")
    assert summary.shape[0] == 1 and 0 < float(summary["mean"].iloc[0]) < math.pi
    axes = az.plot_posterior(idata, var_names=["eta"])
    assert np.asarray(axes).size == 1
    matplotlib.pyplot.close("all")
    assert model_figures(result.model, data) == {}  # no single η to draw


def test_compare_guides_reports_point_and_latent_symmetry():
    table = pi.compare_guides(
        "basis-regression",
        "basis-toy",
        ["mean-field"],
        steps=30,
        K=(5,),
        symmetry_priors=(None, "uniform"),
        eval_samples=4,
    )
    assert [r["guide"] for r in table.rows] == ["mean-field / η point", "mean-field / η uniform"]
    assert [r["symmetry_prior"] for r in table.rows] == [None, "uniform"]
    latent = table.rows[1]
    assert latent["eta_readable"].startswith("q-median lambda=")
    assert latent["log_evidence"] is not None and math.isfinite(latent["log_evidence"])
    assert "Occam factor" in table.to_text()
    json.dumps(table.to_dict())
    with pytest.raises(ValueError, match="needs a catalogue model name"):
        pi.compare_guides(get("basis-regression"), "basis-toy", ["mean-field"], symmetry_priors=(None, "uniform"))


def test_cli_fits_a_latent_symmetry(tmp_path):
    from pyro_invariance.cli import main

    out = tmp_path / "run"
    code = main(
        [
            "fit",
            "--model",
            "basis-regression",
            "--data",
            "basis-toy",
            "--guide",
            "mean-field",
            "--steps",
            "5",
            "--model-arg",
            "symmetry_prior=uniform",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["eta_readable"].startswith("q-median lambda=")
