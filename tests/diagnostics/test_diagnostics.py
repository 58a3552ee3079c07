"""Tests of ``pyro_invariance.diagnostics.inference_data.to_inference_data`` (guide and MCMC draws -> ArviZ) and of
the ArviZ functions on its result for every registered model (ArviZ 0.23 here; the ArviZ 1.x side of
the container is checked through ``arviz_compat`` with a monkeypatched version, and for real by
``make test-arviz1`` in tests/diagnostics/test_arviz_compat.py)."""

from __future__ import annotations

import math
import warnings
from functools import cache

import torch

torch.set_num_threads(1)

import arviz as az  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402
from pyro.infer import MCMC, NUTS  # noqa: E402
from pyro.nn import PyroModule, PyroSample  # noqa: E402

import pyro_invariance  # noqa: E402
from pyro_invariance import guides, to_inference_data  # noqa: E402
from pyro_invariance.diagnostics import arviz_compat  # noqa: E402
from pyro_invariance.diagnostics import inference_data as diagnostics  # noqa: E402
from pyro_invariance.models.basis_regression import BasisRegression, make_symmetric_toy  # noqa: E402

STEPS = 30
DRAWS = 7


@cache
def digits():
    return pyro_invariance.data.images.load_dataset("digits", train_size=200, test_size=100)


def build_invariant_mlp():
    """Model, data and the expected ``{site: (dims, shape)}`` / obs dims of the conversion."""
    model = pyro_invariance.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=32, num_transforms=4)
    sites = {
        "out_weight": (("class", "hidden"), (10, 32)),
        "out_bias": (("class",), (10,)),
        "prior_scale": ((), ()),
    }
    return model, digits(), sites, ("data",)


def build_basis_regression():
    model = BasisRegression(out_features=2, num_features=12)
    data = make_symmetric_toy(60, num_outputs=2)
    return model, data, {"weight": (("output", "feature"), (2, 12))}, ("data", "output")


def build_symmetrised_hnn():
    """A tiny HNN on random (q, p) pairs; dims as its ``arviz_dims()`` gives them (else generic)."""
    model = pyro_invariance.models.get("symmetrised-hnn", state_dim=2, hidden=(8, 8), num_transforms=2, euler_steps=1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=gen)
    data = (x, x + 0.1 * torch.randn(40, 2, generator=gen))
    shapes = {"weight_0": (8, 2), "weight_1": (8, 8), "weight_2": (1, 8)}
    obs_dims = ("data", *model_dims(model, "obs", 2)[1:])  # the data dim is named after the data plate
    return model, data, {k: (model_dims(model, k, len(v)), v) for k, v in shapes.items()}, obs_dims


def build_layerwise(variant: str):
    """A width-1 layer-wise network on 8×8 digits; every weight and bias site."""

    def build():
        model = pyro_invariance.models.get(f"layerwise-{variant}", image_shape=(1, 8, 8), num_classes=10, alpha=1)
        shapes = model.site_shapes()
        return model, digits(), {k: (model_dims(model, k, len(v)), v) for k, v in shapes.items()}, ("data",)

    return build


def model_dims(model, site, ndim):
    """What the model's ``arviz_dims()`` says for ``site``, else the generic ``<site>_dim_<i>``."""
    given = model.arviz_dims()
    return tuple(given.get(site, [f"{site}_dim_{i}" for i in range(ndim)]))


def build_rotation_toy_2d():
    model = pyro_invariance.models.get("rotation-toy-2d", hidden=8, num_transforms=4)
    data = pyro_invariance.DATASETS.get("rotation-toy-2d", train_size=30, test_size=20)
    return model, data, {"out_weight": (("logit", "hidden"), (1, 8)), "out_bias": (("logit",), (1,))}, ("data",)


#: One builder per registered model. A new catalogue model needs an entry here.
BUILDERS = {
    "invariant-mlp": build_invariant_mlp,
    "basis-regression": build_basis_regression,
    "symmetrised-hnn": build_symmetrised_hnn,
    "rotation-toy-2d": build_rotation_toy_2d,
    **{
        f"layerwise-{v}": build_layerwise(v)
        for v in ("fc", "conv", "fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv")
    },
}


@cache
def fitted(name: str, guide: str = "mean-field"):
    model, data, sites, obs_dims = BUILDERS[name]()
    steps = 3 if name.startswith("layerwise-") else STEPS  # the conversion, not the fit, is under test
    result = pyro_invariance.fit(model, guide, data, steps=steps, batch_size=64, progress=False)
    return result, data, sites, obs_dims


def rows(data, split="train"):
    if isinstance(data, tuple):
        return data[0].shape[0]
    return (data.x_train if split == "train" else data.x_test).shape[0]


# -------------------------------------------------------------------------------------------------
# round trip for every registered model


@pytest.mark.parametrize("name", pyro_invariance.MODELS.names())
def test_round_trip_every_registered_model(name):
    if name not in BUILDERS:
        pytest.fail(
            f"model {name!r} is registered but tests/diagnostics/test_diagnostics.py has no builder for it: "
            "add a build_<model>() returning (model, data, expected sites, obs dims) to BUILDERS"
        )
    result, data, sites, obs_dims = fitted(name)
    idata = to_inference_data(result, data, num_samples=DRAWS)
    n = rows(data)

    for group in ("posterior", "log_likelihood", "posterior_predictive", "observed_data", "sample_stats"):
        assert group in idata.groups(), group
    post = idata.posterior
    assert set(post.data_vars) == set(sites)
    for site, (dims, shape) in sites.items():
        assert post[site].dims == ("chain", "draw", *dims), site
        assert post[site].shape == (1, DRAWS, *shape), site
        assert np.isfinite(post[site].values).all()

    ll = idata.log_likelihood["obs"]
    assert ll.dims == ("chain", "draw", "data")
    assert ll.shape == (1, DRAWS, n)
    assert np.isfinite(ll.values).all()
    obs = idata.observed_data["obs"]
    assert obs.dims == obs_dims and obs.shape[0] == n
    pp = idata.posterior_predictive["obs"]
    assert pp.dims == ("chain", "draw", *obs_dims) and pp.shape == (1, DRAWS, *obs.shape)
    assert idata.sample_stats["lp"].shape == (1, DRAWS) and idata.sample_stats["log_q"].shape == (1, DRAWS)

    eta = result.eta
    assert list(idata.constant_data["generator"].values) == list(eta)
    np.testing.assert_allclose(idata.constant_data["eta"].values, list(eta.values()), rtol=1e-6)
    attrs = idata.posterior.attrs
    assert attrs["model"] == name and attrs["guide"] == "mean-field" and attrs["split"] == "train"
    for k, v in eta.items():
        assert attrs[f"eta_{k}"] == pytest.approx(v)

    if not isinstance(data, tuple):
        test = to_inference_data(result, data, num_samples=2, split="test")
        assert test.log_likelihood["obs"].shape == (1, 2, rows(data, "test"))
        assert test.posterior.attrs["split"] == "test"


def test_builders_only_name_registered_models():
    assert set(BUILDERS) <= set(pyro_invariance.MODELS.names())


def _small_selection(post):
    """The posterior variable with the fewest elements and coords keeping <= 2 values per dim
    (plots of a 10 x 256 weight would take minutes)."""
    var = min(post.data_vars, key=lambda v: post[v].size)
    coords = {d: post[d].values[:2].tolist() for d in post[var].dims if d not in ("chain", "draw")}
    return var, coords


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", pyro_invariance.MODELS.names())
def test_arviz_functions_every_registered_model(name):
    """az.summary, az.loo (Pareto k̂ per datum), the approximate-posterior LOO, az.plot_posterior and
    az.plot_forest on the guide draws of every catalogue model."""
    if name not in BUILDERS:
        pytest.fail(f"model {name!r} is registered but has no builder in tests/diagnostics/test_diagnostics.py")
    result, data, _, _ = fitted(name)
    idata = to_inference_data(result, data, num_samples=DRAWS)
    n = rows(data)

    # az.summary costs ~5 ms per scalar (ESS, R-hat): the smallest sites, up to ~200 scalars
    names, total = [], 0
    for v in sorted(idata.posterior.data_vars, key=lambda v: idata.posterior[v].size):
        size = idata.posterior[v].size // DRAWS
        if names and total + size > 200:
            break
        names.append(v)
        total += size
    table = az.summary(idata, var_names=names)
    assert len(table) == total
    assert np.isfinite(table["mean"]).all()

    loo = az.loo(idata, pointwise=True)
    assert loo.pareto_k.shape == (n,) and loo.pareto_k.dims == ("data",)
    assert np.isfinite(loo["elpd_loo"])
    approx = arviz_compat.loo_values(diagnostics.loo_approximate_posterior(idata))
    assert approx.approx_posterior and approx.pareto_k.shape == (n,) and approx.n_samples == DRAWS
    assert np.isfinite(approx.elpd)

    var, coords = _small_selection(idata.posterior)
    axes = az.plot_posterior(idata, var_names=[var], coords=coords)
    assert np.size(axes) == max(1, math.prod(len(v) for v in coords.values()))
    plt.close("all")
    axes = az.plot_forest(idata, var_names=[var], coords=coords, combined=True)
    assert len(np.ravel(axes)) >= 1
    plt.close("all")


def test_class_coords_from_the_dataset():
    result, data, _, _ = fitted("invariant-mlp")
    idata = to_inference_data(result, data, num_samples=2)
    assert list(idata.posterior["class"].values) == list(data.info["classes"])
    assert idata.posterior["out_weight"].sel({"class": "3"}).shape == (1, 2, 32)
    assert list(idata.constant_data["generator"].values) == list(result.eta)


# -------------------------------------------------------------------------------------------------
# ArviZ functions on the result


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_summary_and_loo():
    result, data, sites, _ = fitted("invariant-mlp")
    idata = to_inference_data(result, data, num_samples=20)
    summary = az.summary(idata)
    assert len(summary) == sum(math.prod(shape) for _, shape in sites.values())  # 320 + 10 + 1
    assert "out_weight[3, 31]" in summary.index and "prior_scale" in summary.index
    assert np.isfinite(summary["mean"]).all()

    loo = az.loo(idata, pointwise=True)
    assert loo.pareto_k.shape == (rows(data),)
    assert loo.pareto_k.dims == ("data",)
    assert np.isfinite(loo["elpd_loo"])


def test_log_likelihood_matches_the_model_by_hand():
    """BasisRegression has no randomness besides θ: recompute log N(y | φWᵀ, σ²) per datum."""
    result, (x, y), _, _ = fitted("basis-regression")
    model = result.model
    idata = to_inference_data(result, (x, y), num_samples=5)
    weight = torch.as_tensor(idata.posterior["weight"].values[0])  # (S, D_out, F)
    with torch.no_grad():
        mean = model.features(x) @ weight.transpose(-1, -2)  # (S, N, D_out)
        expected = dist.Normal(mean, model.noise_scale).log_prob(y).sum(-1)  # (S, N)
        prior = dist.Normal(0.0, model.prior_scale).log_prob(weight).sum((-1, -2))
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(idata.observed_data["obs"].values, y.numpy())
    np.testing.assert_allclose(idata.sample_stats["lp"].values[0], (prior + expected.sum(-1)).numpy(), rtol=1e-4)


# -------------------------------------------------------------------------------------------------
# guides


@pytest.mark.parametrize("guide", ["mean-field", "block-cholesky", "matrix-normal", "map"])
def test_guides(guide):
    result, data, sites, _ = fitted("invariant-mlp", guide)
    idata = to_inference_data(result, data, num_samples=DRAWS)
    assert idata.posterior.attrs["guide"] == guide
    for site, (dims, shape) in sites.items():
        assert idata.posterior[site].shape == (1, DRAWS, *shape)
    ll = idata.log_likelihood["obs"].values
    assert ll.shape == (1, DRAWS, rows(data)) and np.isfinite(ll).all() and (ll <= 0).all()
    spread = np.ptp(idata.posterior["out_weight"].values[0], axis=0).max()
    if guide == "map":
        assert spread == 0.0 and (idata.sample_stats["log_q"].values == 0).all()
    else:
        assert spread > 0.0


# -------------------------------------------------------------------------------------------------
# determinism, chunking and the (model, guide) pair


def test_chunks_seed_and_pair_input():
    result, data, _, _ = fitted("invariant-mlp")
    before = torch.get_rng_state()
    whole = to_inference_data((result.model, result.guide), data, num_samples=4, seed=3)
    assert torch.equal(torch.get_rng_state(), before)  # global RNG untouched
    chunked = to_inference_data(result, data, num_samples=4, seed=3, batch_size=64)
    for group, var in (("posterior", "out_weight"), ("log_likelihood", "obs")):
        np.testing.assert_allclose(whole[group][var].values, chunked[group][var].values, rtol=1e-5, atol=1e-6)
    other = to_inference_data(result, data, num_samples=4, seed=4)
    assert not np.allclose(whole.posterior["out_weight"].values, other.posterior["out_weight"].values)
    assert whole.posterior.attrs["guide"] == "mean-field"  # found from the registry without a spec


# -------------------------------------------------------------------------------------------------
# models without arviz_dims / without an observed site


class _Plain(PyroModule):
    """Linear regression with a (3, 2) weight and no ``arviz_dims``."""

    def __init__(self, observe: bool = True) -> None:
        super().__init__()
        self.observe = observe
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))

    def forward(self, x, y=None, num_data=None):
        mean = x @ self.w
        if self.observe:
            with pyro.plate("data", num_data or x.shape[0], subsample=torch.arange(x.shape[0])):
                pyro.sample("y", dist.Normal(mean, 1.0).to_event(1), obs=y)
        return mean


def _plain_data():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(20, 3, generator=gen), torch.randn(20, 2, generator=gen)


def test_generic_dims_and_single_observed_site():
    model = _Plain()
    idata = to_inference_data((model, guides.get("mean-field", model)), _plain_data(), num_samples=3)
    assert idata.posterior["w"].dims == ("chain", "draw", "w_dim_0", "w_dim_1")
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert idata.observed_data["y"].shape == (20, 2)
    assert "constant_data" not in idata.groups()


def test_bad_arviz_dims():
    model = BasisRegression(num_features=4)
    model.arviz_dims = lambda: {"weight": ["row"]}  # the weight has 2 dims
    with pytest.raises(ValueError, match="arviz_dims"):
        to_inference_data((model, guides.get("mean-field", model)), make_symmetric_toy(20), num_samples=2)


def test_arviz_dims_of_other_models_are_not_read():
    """Only catalogue models declare dims (CatalogueModel.arviz_dims); any other module gets generic names."""
    model = _Plain()
    model.arviz_dims = lambda: {"w": ["row"]}
    idata = to_inference_data((model, guides.get("mean-field", model)), _plain_data(), num_samples=2)
    assert idata.posterior["w"].dims == ("chain", "draw", "w_dim_0", "w_dim_1")


def test_model_without_observed_site():
    model = _Plain(observe=False)
    with pytest.raises(ValueError, match="model has no observed site"):
        to_inference_data((model, guides.get("mean-field", model)), _plain_data(), num_samples=2)


@pytest.mark.parametrize("num_samples", [0, -3, 2.5, True, "10"])
def test_bad_num_samples(num_samples):
    model = _Plain()
    with pytest.raises(ValueError, match="num_samples"):
        to_inference_data((model, guides.get("mean-field", model)), _plain_data(), num_samples=num_samples)


def test_bad_split_and_input():
    model = _Plain()
    pair = (model, guides.get("mean-field", model))
    with pytest.raises(ValueError, match="split"):
        to_inference_data(pair, _plain_data(), num_samples=2, split="valid")
    with pytest.raises(TypeError, match="FitResult"):
        to_inference_data(model, _plain_data(), num_samples=2)


# -------------------------------------------------------------------------------------------------
# the ArviZ 1.x container (xarray.DataTree), built here by pretending to be on ArviZ 1.x


def test_datatree_container_when_on_arviz_1(monkeypatch):
    import xarray as xr  # a dependency of ArviZ; constraints.txt pins a release with DataTree

    assert hasattr(xr, "DataTree"), f"xarray {xr.__version__} has no DataTree"
    monkeypatch.setattr(arviz_compat, "is_legacy", lambda: False)
    result, (x, y), _, _ = fitted("basis-regression")
    tree = to_inference_data(result, (x, y), num_samples=3)
    assert isinstance(tree, xr.DataTree)
    assert set(arviz_compat.group_names(tree)) == {
        "posterior",
        "log_likelihood",
        "posterior_predictive",
        "observed_data",
        "sample_stats",
        "constant_data",
    }
    assert tree["posterior"]["weight"].dims == ("chain", "draw", "output", "feature")
    assert tree["posterior"]["weight"].shape == (1, 3, 2, 12)
    assert tree["log_likelihood"]["obs"].dims == ("chain", "draw", "data")
    assert list(tree["constant_data"]["generator"].values) == ["lambda"]
    assert tree.attrs["guide"] == "mean-field" and tree["posterior"].attrs["model"] == "basis-regression"


# -------------------------------------------------------------------------------------------------
# MCMC draws: exact posterior draws as arrays, and NUTS


def _exact_loo(model, x, y):
    """log p(y_i | x_i, D_{-i}) in closed form (Gaussian predictive of the leave-one-out posterior)."""
    out = []
    with torch.no_grad():
        for i in range(x.shape[0]):
            keep = torch.arange(x.shape[0]) != i
            mean, cov = model.posterior(x[keep], y[keep])
            phi = model.features(x[i : i + 1]).to(torch.float64)  # (1, F)
            var = (phi @ cov @ phi.T).squeeze() + model.noise_scale**2
            out.append(dist.Normal(phi @ mean.T, var.sqrt()).log_prob(y[i : i + 1].to(torch.float64)).sum())
    return torch.stack(out).numpy()


def _exact_draws(model, x, y, chains, draws, seed=0):
    with torch.no_grad():
        mean, cov = model.posterior(x, y)
        gen = torch.Generator().manual_seed(seed)
        z = torch.randn(chains, draws, *mean.shape, dtype=torch.float64, generator=gen)
        return (mean + z @ torch.linalg.cholesky(cov).T).to(torch.float32)  # rows ~ N(M_d, Σ)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_mcmc_draws_as_arrays_match_the_exact_loo():
    """Exact posterior draws of BasisRegression, 2 chains: layout, lp, and PSIS-LOO ≈ the exact LOO."""
    model = BasisRegression(out_features=2, num_features=12)
    x, y = make_symmetric_toy(60, num_outputs=2)
    weight = _exact_draws(model, x, y, 2, 250)
    idata = to_inference_data((model, {"weight": weight}), (x, y))
    post = idata.posterior
    assert post["weight"].dims == ("chain", "draw", "output", "feature") and post["weight"].shape == (2, 250, 2, 12)
    np.testing.assert_allclose(post["weight"].values, weight.numpy())
    assert idata.log_likelihood["obs"].shape == (2, 250, 60)
    assert idata.posterior_predictive["obs"].shape == (2, 250, 60, 2)
    assert set(idata.sample_stats.data_vars) == {"lp"}
    assert post.attrs["inference"].startswith("MCMC") and post.attrs["num_samples"] == 500
    assert "guide" not in post.attrs and post.attrs["model"] == "basis-regression"

    exact = _exact_loo(model, x, y)
    loo = az.loo(idata, pointwise=True)
    assert loo["elpd_loo"] == pytest.approx(exact.sum(), abs=1.0)
    np.testing.assert_allclose(loo.loo_i.values, exact, atol=0.3)
    table = az.summary(idata)
    assert (table["r_hat"] < 1.05).all()

    first = to_inference_data((model, {"weight": weight}), (x, y), num_samples=10)
    assert first.posterior["weight"].shape == (2, 10, 2, 12)


def test_mcmc_draws_bad_input():
    model = BasisRegression(out_features=2, num_features=12)
    x, y = make_symmetric_toy(20, num_outputs=2)
    with pytest.raises(ValueError, match="no values for the model's latent site 'weight'"):
        to_inference_data((model, {"other": torch.zeros(1, 3)}), (x, y))
    with pytest.raises(ValueError, match="same \\(chain, draw\\)"):
        to_inference_data((model, {"weight": torch.zeros(1, 3, 2, 12), "w2": torch.zeros(2, 3)}), (x, y))
    with pytest.raises(ValueError, match="draws per chain"):
        to_inference_data((model, {"weight": torch.zeros(1, 3, 2, 12)}), (x, y), num_samples=4)
    with pytest.raises(ValueError, match="empty"):
        to_inference_data((model, {}), (x, y))


def _nuts(num_samples, warmup, seed=0):
    model = BasisRegression(out_features=1, num_features=4, noise_scale=0.5)  # 4 bumps fit the toy to ≈0.5
    x, y = make_symmetric_toy(40, num_outputs=1)
    pyro.set_rng_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "num_chains=2 is more than available_cpu=1" on 2 cores
        mcmc = MCMC(NUTS(model), num_samples=num_samples, warmup_steps=warmup, num_chains=2, disable_progbar=True)
        mcmc.run(x, y)
    return model, x, y, mcmc


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nuts_mcmc_object():
    """A short NUTS run (2 chains x 15 draws): posterior, sample_stats and sampler attrs."""
    model, x, y, mcmc = _nuts(15, 15)
    idata = to_inference_data(mcmc, (x, y))
    post = idata.posterior
    assert post["weight"].dims == ("chain", "draw", "output", "feature") and post["weight"].shape == (2, 15, 1, 4)
    np.testing.assert_allclose(post["weight"].values, mcmc.get_samples(group_by_chain=True)["weight"].numpy())
    stats = idata.sample_stats
    assert stats["diverging"].shape == (2, 15) and stats["diverging"].dtype == bool
    assert stats["lp"].shape == (2, 15) and "log_q" not in stats
    attrs = post.attrs
    assert attrs["sampler"] == "NUTS" and attrs["num_chains"] == 2 and attrs["num_warmup"] == 15
    assert 0.0 < attrs["acceptance_rate"] <= 1.0 and attrs["step_size"] > 0
    assert attrs["model"] == "basis-regression" and attrs["eta_lambda"] == pytest.approx(0.5)
    assert idata.log_likelihood["obs"].shape == (2, 15, 40)
    assert az.loo(idata, pointwise=True).pareto_k.shape == (40,)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nuts_agrees_with_the_exact_posterior():
    """2 chains x 100 NUTS draws (≈20 s on one thread): means within 4 Monte Carlo standard errors of
    the exact posterior mean, R-hat < 1.1, elpd_loo close to the exact LOO."""
    model, x, y, mcmc = _nuts(100, 100)
    idata = to_inference_data(mcmc, (x, y))
    table = az.summary(idata, var_names=["weight"])
    mean, _ = model.posterior(x, y)
    err = np.abs(table["mean"].values - mean.detach().numpy().ravel()) / table["mcse_mean"].values
    assert (err < 4).all(), err
    assert (table["r_hat"] < 1.1).all()
    assert not idata.sample_stats["diverging"].values.any()
    assert az.loo(idata)["elpd_loo"] == pytest.approx(_exact_loo(model, x, y).sum(), abs=1.0)
