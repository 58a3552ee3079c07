"""ArviZ as a user calls it on ``to_inference_data``'s export: ``az.summary(idata)`` without warnings (the
independent guide draws laid out as chains, the export saying how to ask for the statistics alone), a
point-estimate η that ArviZ's plots find when asked for and that the library's wrappers refuse in one line
when it is left out of the posterior, and observation dims named after the data plate -- on a catalogue
model and on a model written the way Pyro's tutorials write them."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from small_runs import small_digits, small_fit

import pyro_invariance as pi
from pyro_invariance.diagnostics import inference_data as diagnostics


class BayesLinear(PyroModule):
    """Bias-free Bayesian linear regression as in Pyro's tutorials: ``PyroSample`` prior, ``forward(x, y=None)``,
    the observations in a plate (named ``plate``)."""

    def __init__(self, features: int = 5, plate: str = "data") -> None:
        super().__init__()
        self.plate = plate
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, features]).to_event(2))

    def forward(self, x, y=None):
        mean = (x @ self.weight.T).squeeze(-1)
        with pyro.plate(self.plate, x.shape[0]):
            return pyro.sample("obs", dist.Normal(mean, 0.5), obs=y)


def linear_data(n: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, generator=gen)
    return x, x.sum(-1) + 0.5 * torch.randn(n, generator=gen)


@pytest.fixture(scope="module")
def digits():
    return small_digits()


@pytest.fixture(scope="module")
def fitted(digits):
    """The small invariant MLP (η a point estimate, the catalogue's default) after 12 steps."""
    return small_fit(digits)


@pytest.fixture(scope="module")
def user_fit():
    return pi.fit(BayesLinear(), "mean-field", linear_data(), steps=20, progress=False)


@contextmanager
def quiet(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Python warnings raised as errors, and no ArviZ log record at WARNING or above (ArviZ logs its
    "Shape validation failed" warning instead of warning)."""
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        caplog.clear()
        yield
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ------------------------------------------------------------------------------------------------ az.summary


def test_summary_of_catalogue_guide_draws_runs_without_warnings(fitted, digits, caplog):
    idata = pi.to_inference_data(fitted, digits, num_samples=20)
    assert idata.posterior["out_weight"].shape[:2] == (2, 10)  # 20 independent draws as 2 chains of 10
    with quiet(caplog):
        table = az.summary(idata)
    assert len(table) == 10 * 16 + 10 + 1  # out_weight, out_bias, prior_scale
    assert {"mean", "sd", "ess_bulk", "r_hat"} <= set(table.columns)
    assert np.isfinite(table.to_numpy(dtype=float)).all()  # no NaN R-hat


def test_summary_of_a_user_pyro_model_runs_without_warnings(user_fit, caplog):
    idata = pi.to_inference_data(user_fit, linear_data(), num_samples=40)
    with quiet(caplog):
        table = az.summary(idata)
    assert list(table.index) == [f"weight[0, {i}]" for i in range(5)]
    assert np.isfinite(table.to_numpy(dtype=float)).all()


def test_export_says_how_to_ask_for_the_statistics_alone(user_fit, caplog):
    idata = pi.to_inference_data(user_fit, linear_data(), num_samples=8)
    attrs = idata.posterior.attrs
    assert attrs["draws"] == "independent" and attrs["num_chains"] == 2
    assert 'az.summary(idata, kind="stats")' in attrs["summary_hint"]
    stats = ["mean", "sd", "hdi_3%", "hdi_97%"]
    with quiet(caplog):
        assert list(az.summary(idata, kind="stats").columns) == stats
        assert list(diagnostics.summary(idata).columns) == stats  # the library's summary: statistics by default
    assert "r_hat" in diagnostics.summary(idata, kind="all").columns
    # MCMC draws keep their diagnostics
    draws = {"weight": torch.randn(2, 10, 1, 5, generator=torch.Generator().manual_seed(1))}
    mcmc = pi.to_inference_data((BayesLinear(), draws), linear_data())
    assert mcmc.posterior.attrs["draws"] == "mcmc" and "summary_hint" not in mcmc.posterior.attrs
    assert "r_hat" in diagnostics.summary(mcmc).columns


# ------------------------------------------------------------------------------------------------ η


def test_point_eta_in_the_posterior_plots_with_arviz(fitted, digits):
    idata = pi.to_inference_data(fitted, digits, num_samples=8, eta_in_posterior=True)
    eta = idata.posterior["eta"]
    assert eta.dims == ("chain", "draw", "generator") and list(eta["generator"].values) == list(fitted.eta)
    np.testing.assert_allclose(eta.values, np.broadcast_to(list(fitted.eta.values()), eta.shape), rtol=1e-6)
    assert eta.attrs["estimate"] == "point" and "symmetry_prior" in eta.attrs["hint"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ: "Your data appears to have a single value"
        axes = az.plot_posterior(idata, var_names=["eta"])
    assert np.size(axes) == 1
    plt.close("all")
    assert list(idata.constant_data["eta"].values) == pytest.approx(list(fitted.eta.values()))  # still there


def test_point_eta_out_of_the_posterior_is_refused_in_one_line(fitted, digits):
    idata = pi.to_inference_data(fitted, digits, num_samples=8)
    assert "eta" not in idata.posterior and "eta" in idata.constant_data
    for call in (diagnostics.plot_posterior, diagnostics.summary, diagnostics.plot_forest):
        with pytest.raises(ValueError) as err:
            call(idata, var_names=["eta"])
        text = one_line(err)
        assert text.startswith("'eta' is not in the posterior group but in constant_data")
        assert "eta_in_posterior=True" in text and "symmetry_prior=" in text
    plt.close("all")


# ------------------------------------------------------------------------------------------------ dims


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")  # 8 draws: k̂ is large
def test_observation_dims_are_named_after_the_data_plate(fitted, digits):
    idata = pi.to_inference_data(fitted, digits, num_samples=8)
    assert idata.log_likelihood["obs"].dims == ("chain", "draw", "data")
    assert idata.observed_data["obs"].dims == ("data",)
    assert idata.posterior_predictive["obs"].dims == ("chain", "draw", "data")
    assert az.loo(idata, pointwise=True).pareto_k.dims == ("data",)
    user = pi.to_inference_data((BayesLinear(plate="rows"), {"weight": torch.zeros(2, 4, 1, 5)}), linear_data())
    assert user.log_likelihood["obs"].dims == ("chain", "draw", "rows")
    assert user.observed_data["obs"].dims == ("rows",)


# ------------------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize(
    ("num_samples", "chains", "shape"),
    [(8, None, (2, 4)), (40, None, (2, 20)), (7, None, (1, 7)), (6, None, (1, 6)), (8, 1, (1, 8)), (8, 4, (4, 2))],
)
def test_guide_draws_are_laid_out_as_chains(user_fit, num_samples, chains, shape):
    idata = pi.to_inference_data(user_fit, linear_data(), num_samples=num_samples, chains=chains)
    assert idata.posterior["weight"].shape == (*shape, 1, 5)
    assert idata.log_likelihood["obs"].shape == (*shape, 30)
    assert idata.posterior.attrs["num_samples"] == num_samples and idata.posterior.attrs["num_chains"] == shape[0]


def test_layout_arguments_are_checked_in_one_line(user_fit):
    data = linear_data()
    cases = [
        ({"num_samples": 8, "chains": 3}, r"^num_samples=8 is not a multiple of chains=3"),
        ({"chains": 0}, r"^chains must be an integer >= 1, got 0$"),
        ({"eta_in_posterior": "yes"}, r"^eta_in_posterior must be True or False, got 'yes'$"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            pi.to_inference_data(user_fit, data, **kwargs)
        one_line(err)
    with pytest.raises(ValueError, match=r"^chains=2 lays out guide draws; MCMC draws keep their own") as err:
        pi.to_inference_data((BayesLinear(), {"weight": torch.zeros(2, 4, 1, 5)}), data, chains=2)
    one_line(err)
