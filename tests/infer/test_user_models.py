"""The workbench on a user's own Pyro model, written as Pyro's tutorials write it: ``model(x, y=None)``
without ``num_data`` (``fit``, ``compare_guides``, ``evaluate``, the bounds).

Such a model scores the rows it is given as the whole data set, so it is fitted full batch: said in a
warning when the minibatch came from the defaults, refused in one line when asked for explicitly.
Under ``pi.fit`` every guide's bound stays below the exact log evidence.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_bound_validity import BayesianRegression, UnknownPrecision, _precision_data, _regression_data

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.infer.bounds import evidence_bounds
from pyro_invariance.validation import num_data_kwargs, takes_num_data

BOUND_GUIDES = [name for name in guides.names() if name != "map"]


def _more_rows(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g)
    return x, x @ torch.randn(5, generator=g) + 0.5 * torch.randn(n, generator=g)


def test_the_protocol_tells_plain_models_from_catalogue_ones():
    catalogue = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=4, num_transforms=2)
    assert takes_num_data(catalogue) and num_data_kwargs(catalogue, 7) == {"num_data": 7}
    assert not takes_num_data(BayesianRegression()) and num_data_kwargs(BayesianRegression(), 7) == {}
    assert not takes_num_data(lambda x, y=None: None) and takes_num_data(lambda x, y=None, **kw: None)


def test_fit_runs_a_plain_model_full_batch_and_says_so():
    x, y = _more_rows()
    with pytest.warns(
        UserWarning, match=r"fitting all 200 rows per step \(not batch_size=128\): the model takes no num_data"
    ) as caught:
        result = pi.fit(BayesianRegression(), "mean-field", (x, y), steps=30, progress=False)
    assert result.config.batch_size is None and math.isfinite(result.final_elbo)
    assert {w.filename for w in caught if "fitting all" in str(w.message)} == {__file__}  # names the user's line


def test_an_explicit_minibatch_of_a_plain_model_is_refused_in_one_line():
    x, y = _more_rows()
    with pytest.raises(ValueError) as err:
        pi.fit(BayesianRegression(), "mean-field", (x, y), steps=3, batch_size=32, progress=False)
    text = str(err.value)
    assert "\n" not in text and text.startswith("batch_size=32 of 200 rows: the model takes no num_data")
    assert "batch_size=None" in text and "subsample_size" in text


def test_a_data_set_smaller_than_the_minibatch_fits_without_a_warning():
    x, y, _ = _regression_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        pi.fit(BayesianRegression(), "full-rank", (x, y), steps=5, progress=False)


def test_compare_guides_on_a_plain_model():
    x, y = _more_rows(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PSIS's warning about few draws: not what this test is about
        cmp = pi.compare_guides(BayesianRegression(), (x, y), guides=["mean-field", "full-rank"], steps=40, K=(10,))
    assert [row["guide"] for row in cmp.rows] == ["mean-field", "full-rank"]
    assert all(math.isfinite(row["elbo"]) and math.isfinite(row["iwae10"]) for row in cmp.rows)


@pytest.mark.parametrize("guide_name", BOUND_GUIDES)
@pytest.mark.parametrize("model_name", ["regression", "precision"])
def test_pi_fit_gives_a_bound_below_the_exact_evidence(model_name, guide_name):
    build, data = {
        "regression": (BayesianRegression, _regression_data),
        "precision": (UnknownPrecision, _precision_data),
    }[model_name]
    x, y, log_z = data()
    model = build()
    guide = guides.get(guide_name, model)
    pi.fit(model, guide, (x, y), steps=200, lr=0.05, seed=0, progress=False)
    torch.manual_seed(1)
    elbo = evidence_bounds(model, guide, x, y, Ks=(10,), num_samples=400).elbo
    assert math.isfinite(elbo.value) and elbo.value <= log_z + 3 * elbo.stderr, (elbo.value - log_z, elbo.stderr)


def test_evaluate_takes_a_plain_model():
    x, y = _more_rows(40)
    model = BayesianRegression()
    result = pi.fit(model, "mean-field", (x, y), steps=20, progress=False)
    metrics = pi.evaluate((model, result.guide), (x, y), num_samples=4)
    assert all(math.isfinite(v) for v in metrics.values())
