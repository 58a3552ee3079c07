"""A fitted result keeps its parameters wherever it is used.

Two fits of catalogue models with the same parameter names in one process, then the results used as a
Pyro user does, outside the package's calls with Pyro's defaults (global param store): ``median()``,
``quantiles()``, ``pyro.infer.Predictive``, a plain ``pyro.infer.SVI`` step. Each result reads its own
values and no call on one changes the other's, while the store still lists the parameters under
Pyro's names and a fresh guide still takes values loaded into the store by name.
"""

from __future__ import annotations

import gc

import pyro
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from small_runs import fit_state, small_digits, small_fit, small_model

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.arrays import train_arrays

torch.set_num_threads(1)
pytestmark = pytest.mark.plain_pyro  # Pyro's defaults, as a user's session has them (tests/conftest.py)


@pytest.fixture(scope="module")
def digits():
    return small_digits()


@pytest.fixture()
def clean_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _snapshot(result) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in fit_state(result).items()}


def _unchanged(result, before: dict[str, torch.Tensor]) -> bool:
    now = fit_state(result)
    return list(now) == list(before) and all(torch.equal(now[k], before[k]) for k in before)


def _medians(guide) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {k: v.detach().clone() for k, v in guide.median().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _evaluate(result, digits) -> dict[str, float]:
    return pi.evaluate(result, digits, num_samples=2, num_particles=1)


def _predict(result, x: torch.Tensor) -> None:
    with torch.no_grad():
        Predictive(result.model, guide=result.guide, num_samples=2)(x[:8])


def _shares(a, b) -> bool:
    ids = {id(p) for p in [*a.model.parameters(), *a.guide.parameters()]}
    return any(id(p) in ids for p in [*b.model.parameters(), *b.guide.parameters()])


@pytest.mark.parametrize("guide", ["map", "mean-field", "full-rank"])
def test_each_fit_keeps_its_values_outside_the_package(digits, clean_store, guide):
    """median(), quantiles() and Predictive of two same-named fits, in turn and repeatedly: each returns its
    own values, and evaluate reports what it did right after the fit."""
    r1 = small_fit(digits, guide=guide, seed=1)
    med1, eval1, state1 = _medians(r1.guide), _evaluate(r1, digits), _snapshot(r1)
    r2 = small_fit(digits, guide=guide, seed=2)
    med2, eval2, state2 = _medians(r2.guide), _evaluate(r2, digits), _snapshot(r2)
    with pi.pyro_scope():  # each guide's own values, read with module-local parameters
        assert _same(med1, _medians(r1.guide)) and _same(med2, _medians(r2.guide))
    assert not _same(med1, med2)  # two fits with different values under the same names
    x, _ = train_arrays(digits, r1.model)
    for _ in range(2):
        for result in (r1, r2):
            _predict(result, x)
            if hasattr(result.guide, "quantiles"):  # not the point-mass guide
                result.guide.quantiles([0.25, 0.75])
    assert pyro.settings.get("module_local_params") is False and len(pyro.get_param_store()) > 0
    assert _same(_medians(r1.guide), med1) and _same(_medians(r2.guide), med2)
    assert _same(_medians(r2.guide), med2) and _same(_medians(r1.guide), med1)
    assert _unchanged(r1, state1) and _unchanged(r2, state2) and not _shares(r1, r2)
    assert _evaluate(r1, digits) == eval1 and _evaluate(r2, digits) == eval2


def test_a_plain_svi_step_on_one_fit_leaves_the_other_alone(digits, clean_store):
    """One Pyro SVI step (pyro.optim.Adam, Trace_ELBO) on either fit trains that fit's own tensors, which the
    store then lists under Pyro's names, and leaves the other fit as it was."""
    r1, r2 = small_fit(digits, guide="mean-field", seed=1), small_fit(digits, guide="mean-field", seed=2)
    x, y = train_arrays(digits, r1.model)
    for trained, other in ((r2, r1), (r1, r2)):
        _predict(other, x)  # the other fit's parameters are in the store under the same names
        before, other_before = _snapshot(trained), _snapshot(other)
        svi = SVI(trained.model, trained.guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
        svi.step(x[:32], y[:32], num_data=x.shape[0])
        assert _unchanged(other, other_before)
        assert not _unchanged(trained, before)  # the step trained this fit's own parameters
        own = {id(p) for p in [*trained.model.parameters(), *trained.guide.parameters()]}
        store = pyro.get_param_store()
        assert any(n.startswith("MeanFieldNormal.") for n in store.keys()) and "eta_unit" in store
        assert all(id(store.get_state()["params"][n]) in own for n in store.keys())
    assert not _shares(r1, r2)


def test_a_fresh_guide_takes_loaded_values_but_never_a_live_fits(digits, clean_store, tmp_path):
    """Pyro's by-name restore still works (values loaded into the store reach a fresh guide), but a fresh
    guide built while a fitted one is in the store starts from its own initial values."""
    r1 = small_fit(digits, guide="mean-field", seed=1)
    x, y = train_arrays(digits, r1.model)
    _predict(r1, x)
    state1 = _snapshot(r1)
    pyro.get_param_store().save(tmp_path / "params.pt")

    fresh = small_model()
    guide = guides.get("mean-field", fresh)
    SVI(fresh, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x[:32], y[:32], num_data=x.shape[0])
    assert _unchanged(r1, state1) and not _shares(r1, _Pair(fresh, guide))
    assert not _same(_medians(guide), _medians(r1.guide))

    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "params.pt")  # as in a new session: the saved values by name
    loaded_model = small_model()
    loaded = guides.get("mean-field", loaded_model)
    with torch.no_grad():
        loaded(x[:8], y[:8], num_data=x.shape[0])  # the guide is set up: its parameters take the stored values
    _predict(_Pair(loaded_model, loaded), x)
    assert _same(_medians(loaded), _medians(r1.guide))
    assert torch.equal(loaded_model.eta_unit, r1.model.eta_unit)
    assert not _shares(r1, _Pair(loaded_model, loaded)) and _unchanged(r1, state1)


class _Pair:
    """A model and a guide, as a fit result holds them."""

    def __init__(self, model, guide) -> None:
        self.model, self.guide = model, guide


def test_a_collected_fits_values_never_pass_into_another_fit(digits, clean_store):
    """The store keeps a collected fit's tensors (after a call in Pyro's global mode): a later fit's
    ``median()`` must still read, and keep, its own values."""
    gone = small_fit(digits, guide="map", seed=0)
    _medians(gone.guide)  # in global mode: its tensors enter the store
    del gone
    gc.collect()
    result = small_fit(digits, guide="map", seed=1)
    with pi.pyro_scope():
        own = _medians(result.guide)
    assert _same(_medians(result.guide), own)
    with pi.pyro_scope():
        assert _same(_medians(result.guide), own)  # and its parameters were not replaced
