"""Tests of ``pyro_invariance/diagnostics/arviz_compat.py`` (and of ``infer/psis.py``, ArviZ's PSIS k̂) on
whichever ArviZ line is installed.

The modules are loaded from their files where the package does not import (its ``__init__`` imports
torch and Pyro), so this file also runs in the torch-free ArviZ 1.x environment of ``make test-arviz1``
(Python 3.12). In the main environment (Python 3.11) it tests the ArviZ 0.23 branch.

Reference: a conjugate Normal model ``y_i ~ N(μ, σ²)``, ``μ ~ N(0, τ²)`` whose posterior and
exact leave-one-out predictive densities ``p(y_i | y_{-i}) = N(y_i; m_{-i}, s²_{-i} + σ²)`` are known
in closed form.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[2] / "pyro_invariance"


def _load(name, path):
    """The module ``name`` of the package: imported through the package where it imports (the main
    environment), else from its file (torch-free: the package's ``__init__`` needs torch)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    if "pyro_invariance._optional" not in sys.modules:  # the one torch-free package module they import
        _from_file("pyro_invariance._optional", PACKAGE / "_optional.py")
    return _from_file(name, path)


def _from_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


ac = _load("pyro_invariance.diagnostics.arviz_compat", PACKAGE / "diagnostics" / "arviz_compat.py")
psis = _load("pyro_invariance.infer.psis", PACKAGE / "infer" / "psis.py")
az = ac.az

SIGMA, TAU, N = 1.0, 10.0, 24


def _normal_logpdf(x, mean, sd):
    return -0.5 * ((x - mean) / sd) ** 2 - np.log(sd) - 0.5 * math.log(2 * math.pi)


def _posterior(y):
    """Mean and sd of p(μ | y)."""
    prec = 1 / TAU**2 + len(y) / SIGMA**2
    return (y.sum() / SIGMA**2) / prec, prec**-0.5


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    y = rng.normal(1.5, SIGMA, N)
    y[0] = 5.0  # one influential point
    m, s = _posterior(y)
    exact_loo = []
    for i in range(N):
        m_i, s_i = _posterior(np.delete(y, i))
        exact_loo.append(_normal_logpdf(y[i], m_i, math.sqrt(s_i**2 + SIGMA**2)))
    return y, m, s, np.array(exact_loo)


def _draws(toy, chains, draws, widen=1.0, seed=1):
    """Arrays for from_arrays: S draws from q = N(m, (widen·s)²) with log p(μ, y) and log q(μ)."""
    y, m, s, _ = toy
    rng = np.random.default_rng(seed)
    mu = rng.normal(m, widen * s, (chains, draws))
    ll = _normal_logpdf(y[None, None, :], mu[..., None], SIGMA)  # (C, D, N)
    lp = _normal_logpdf(mu, 0.0, TAU) + ll.sum(-1)
    log_q = _normal_logpdf(mu, m, widen * s)
    pred = rng.normal(mu[..., None], SIGMA, (chains, draws, len(y)))
    groups = {
        "posterior": {"mu": mu, "w": rng.normal(size=(chains, draws, 3, 2))},
        "log_likelihood": {"y": ll},
        "posterior_predictive": {"y": pred},
        "observed_data": {"y": y},
        "sample_stats": {"lp": lp, "log_q": log_q, "diverging": np.zeros((chains, draws), bool)},
        "constant_data": {"eta": np.array([0.5, 1.0])},
    }
    return groups


def _build(groups, **kwargs):
    kwargs.setdefault("dims", {"w": ["row", "col"], "y": ["obs"], "eta": ["generator"]})
    kwargs.setdefault("coords", {"generator": ["rot", "tx"], "col": ["a", "b"]})
    kwargs.setdefault("attrs", {"model": "toy", "num_samples": 5})
    return ac.from_arrays(groups, **kwargs)


# -------------------------------------------------------------------------------------------------
# building


def test_container_matches_the_arviz_line():
    data = _build(_draws(_toy_small(), 2, 5))
    if ac.is_legacy():
        assert isinstance(data, az.InferenceData)
    else:
        import xarray as xr

        assert isinstance(data, xr.DataTree)
    assert ac.is_legacy() == az.__version__.startswith("0.")


def _toy_small():
    y = np.linspace(-1, 1, N)
    return y, 0.0, 0.2, None


def test_groups_dims_coords_attrs():
    data = _build(_draws(_toy_small(), 2, 5))
    assert set(ac.group_names(data)) == {
        "posterior",
        "log_likelihood",
        "posterior_predictive",
        "observed_data",
        "sample_stats",
        "constant_data",
    }
    post = ac.get_group(data, "posterior")
    assert post["mu"].dims == ("chain", "draw") and post["mu"].shape == (2, 5)
    assert post["w"].dims == ("chain", "draw", "row", "col") and post["w"].shape == (2, 5, 3, 2)
    assert list(post["col"].values) == ["a", "b"] and list(post["row"].values) == [0, 1, 2]
    assert list(post["chain"].values) == [0, 1] and list(post["draw"].values) == list(range(5))
    assert ac.get_group(data, "log_likelihood")["y"].dims == ("chain", "draw", "obs")
    assert ac.get_group(data, "posterior_predictive")["y"].shape == (2, 5, N)
    obs = ac.get_group(data, "observed_data")["y"]
    assert obs.dims == ("obs",) and obs.shape == (N,)
    eta = ac.get_group(data, "constant_data")["eta"]
    assert eta.dims == ("generator",) and list(eta["generator"].values) == ["rot", "tx"]
    stats = ac.get_group(data, "sample_stats")
    assert stats["diverging"].dtype == bool and stats["lp"].shape == (2, 5)
    for group in ac.group_names(data):
        attrs = ac.get_group(data, group).attrs
        assert attrs["model"] == "toy" and attrs["num_samples"] == 5 and "created_at" in attrs
    assert data.attrs["model"] == "toy" and data.attrs["arviz_version"] == az.__version__


def test_generic_dims_group_dims_and_log_likelihood_event_dims():
    rng = np.random.default_rng(0)
    groups = {
        "posterior": {"v": rng.normal(size=(1, 4, 2))},
        "log_likelihood": {"obs": rng.normal(size=(1, 4, 6))},  # event dim summed
        "posterior_predictive": {"obs": rng.normal(size=(1, 4, 6, 3))},
        "observed_data": {"obs": rng.normal(size=(6, 3))},
    }
    data = ac.from_arrays(groups, dims={"obs": ["datum", "output"]}, group_dims={"posterior": {"v": ["side"]}})
    assert ac.get_group(data, "posterior")["v"].dims == ("chain", "draw", "side")
    assert ac.get_group(data, "log_likelihood")["obs"].dims == ("chain", "draw", "datum")
    assert ac.get_group(data, "posterior_predictive")["obs"].dims == ("chain", "draw", "datum", "output")
    assert ac.get_group(data, "observed_data")["obs"].dims == ("datum", "output")
    plain = ac.from_arrays({"posterior": {"v": rng.normal(size=(1, 4, 2, 5))}})
    assert ac.get_group(plain, "posterior")["v"].dims == ("chain", "draw", "v_dim_0", "v_dim_1")


def test_bad_input():
    x = np.zeros((1, 4, 2))
    with pytest.raises(ValueError, match="empty"):
        ac.from_arrays({})
    with pytest.raises(ValueError, match="own dims"):
        ac.from_arrays({"posterior": {"v": x}}, dims={"v": ["a", "b"]})
    with pytest.raises(ValueError, match="coords"):
        ac.from_arrays({"posterior": {"v": x}}, dims={"v": ["a"]}, coords={"a": [1, 2, 3]})
    with pytest.raises(ValueError, match="chain, draw"):
        ac.from_arrays({"posterior": {"v": np.zeros(3)}})
    with pytest.raises(KeyError, match="no group"):
        ac.get_group(ac.from_arrays({"posterior": {"v": x}}), "prior")


# -------------------------------------------------------------------------------------------------
# statistics


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_summary_columns_and_rows():
    data = _build(_draws(_toy_small(), 2, 50))
    table = ac.summary(data, var_names=["mu", "w"])
    assert {"mean", "sd", "mcse_mean", "ess_bulk", "ess_tail", "r_hat"} <= set(table.columns)
    assert len(table) == 1 + 6
    assert np.isfinite(table["mean"].astype(float)).all()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_loo_matches_exact_loo_for_posterior_draws(toy):
    *_, exact = toy
    data = _build(_draws(toy, 2, 1000))
    res = ac.loo_values(ac.loo(data))
    assert res.pareto_k.shape == (N,) and np.isfinite(res.pareto_k).all()
    assert res.elpd_i.shape == (N,) and res.n_samples == 2000 and res.n_data_points == N
    assert not res.approx_posterior
    np.testing.assert_allclose(res.elpd_i, exact, atol=0.02)
    assert res.elpd == pytest.approx(exact.sum(), abs=0.1)
    assert 0.5 < res.p < 2.0  # one parameter
    assert res.se > 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_approximate_posterior_loo_equals_plain_loo_when_q_is_the_posterior(toy):
    data = _build(_draws(toy, 1, 1500))
    plain = ac.loo_values(ac.loo(data))
    approx = ac.loo_values(ac.loo_approximate_posterior(data))  # lp, log_q from sample_stats
    assert approx.approx_posterior
    assert approx.elpd == pytest.approx(plain.elpd, abs=1e-6)
    np.testing.assert_allclose(approx.elpd_i, plain.elpd_i, atol=1e-6)
    np.testing.assert_allclose(approx.pareto_k, plain.pareto_k, atol=1e-6)
    assert approx.p == pytest.approx(plain.p, abs=1e-6)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_approximate_posterior_loo_corrects_a_too_wide_q(toy):
    """Draws from q = N(m, (3s)²): plain PSIS-LOO treats q as the posterior and is biased low;
    with log p − log q the ratios target the LOO posteriors and recover the exact elpd."""
    *_, exact = toy
    data = _build(_draws(toy, 1, 4000, widen=3.0))
    plain = ac.loo_values(ac.loo(data))
    approx = ac.loo_values(ac.loo_approximate_posterior(data))
    assert plain.elpd < exact.sum() - 1.0
    assert approx.elpd == pytest.approx(exact.sum(), abs=0.2)
    assert np.isfinite(approx.pareto_k).all() and approx.pareto_k.shape == (N,)
    # explicit arrays, flat (S,) shape, give the same
    stats = ac.get_group(data, "sample_stats")
    again = ac.loo_values(ac.loo_approximate_posterior(data, stats["lp"].values.ravel(), stats["log_q"].values))
    assert again.elpd == pytest.approx(approx.elpd)


def test_approximate_posterior_loo_bad_input(toy):
    groups = _draws(toy, 1, 20)
    del groups["sample_stats"]
    data = _build(groups)
    with pytest.raises(ValueError, match="log_p"):
        ac.loo_approximate_posterior(data)
    with pytest.raises(ValueError, match="shape"):
        ac.loo_approximate_posterior(data, np.zeros(7), np.zeros(7))
    with pytest.raises(ValueError, match="non-finite"):
        ac.loo_approximate_posterior(data, np.full(20, np.nan), np.zeros(20))


# -------------------------------------------------------------------------------------------------
# PSIS k̂ of importance log weights


@pytest.mark.parametrize("k", [0.3, 0.8])
def test_psis_khat_recovers_the_pareto_shape(k):
    """Weights w = U^(-k) have an exact Pareto tail of shape k; the log weights go in as log
    *ratios* on both lines (1.x's psislw takes a log-likelihood: infer/psis.py negates)."""
    u = np.random.default_rng(1).uniform(size=4000)
    lw = -k * np.log(u)
    for khat in (psis.arviz_khat, psis.psis_khat):  # ArviZ's number, and the checked one around it
        assert khat(lw) == pytest.approx(k, abs=0.15)
        assert khat(-lw) < 0.2  # the other tail is light: a sign slip would show here
    if ac.is_legacy():
        assert psis.arviz_khat(lw) == float(np.asarray(az.psislw(lw.copy(), reff=1.0)[1]))
    assert psis.psis_khat(lw) == psis.arviz_khat(lw)


# -------------------------------------------------------------------------------------------------
# plots


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_plots_return_figures():
    data = _build(_draws(_toy_small(), 2, 30))
    for fig in (ac.plot_posterior(data, var_names=["mu", "w"]), ac.plot_forest(data, var_names=["mu", "w"])):
        assert isinstance(fig, matplotlib.figure.Figure)
        assert len(fig.axes) >= 1
        plt.close(fig)
