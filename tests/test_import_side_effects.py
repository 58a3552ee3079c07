"""Importing the package changes nothing in Pyro or torch; its calls scope what they need.

* ``import pyro_invariance`` leaves ``pyro.settings`` and torch's KL registry as they were (only
  rules for the package's own distribution types are added), in a fresh interpreter;
* the package's calls (``fit``, ``evaluate``, ...) run with ``module_local_params`` and the
  corrected ``KL(Delta ‖ ·)`` and restore both afterwards;
* two models of the same kind train in one process without sharing parameters by name;
* plain Pyro works on catalogue models as Pyro's tutorials say: ``pyro.infer.SVI`` fills the global
  param store, and the library's functions then evaluate the model it trained; a model fitted by
  the library works with a plain ``pyro.infer.Predictive``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions.distribution import Distribution as PyroDistribution
from pyro.infer import SVI, Predictive, Trace_ELBO
from small_runs import small_model
from torch.distributions import kl as torch_kl

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.infer.bounds import evidence_bounds
from pyro_invariance.models.basis_regression import make_symmetric_toy

torch.set_num_threads(1)
pytestmark = pytest.mark.plain_pyro  # Pyro's defaults, as a user's session has them (tests/conftest.py)

DELTA_KEY = (dist.Delta, PyroDistribution)

_FRESH_IMPORT = r"""
import json, torch
import pyro
from torch.distributions import kl
settings = pyro.settings.get()
registry = dict(kl._KL_REGISTRY)
import pyro_invariance as pi
after = dict(kl._KL_REGISTRY)
print(json.dumps({
    "settings_unchanged": pyro.settings.get() == settings,
    "changed": [f"{p.__name__}-{q.__name__}" for (p, q), f in registry.items() if after.get((p, q)) is not f],
    "added": [[p.__module__, q.__module__] for (p, q) in after if (p, q) not in registry],
    "module_local_params": pyro.settings.get("module_local_params"),
    "param_store": len(pyro.get_param_store()),
    "sizes": [len(pi.GUIDES), len(pi.MODELS), len(pi.DATASETS)],
}))
"""


def test_import_leaves_pyro_and_torch_as_they_were():
    out = subprocess.run([sys.executable, "-c", _FRESH_IMPORT], capture_output=True, text=True, check=True, timeout=300)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["settings_unchanged"] and r["module_local_params"] is False
    assert r["changed"] == []  # no existing KL rule replaced (Pyro's KL(Delta ‖ ·) included)
    # the only additions are rules whose first argument is one of our own distribution types
    assert r["added"] and all(p == "pyro_invariance.distributions" for p, _ in r["added"])
    assert r["param_store"] == 0
    assert all(n > 0 for n in r["sizes"])  # GUIDES, MODELS, DATASETS all registered


def test_pyro_scope_sets_and_restores():
    pyro_rule = torch_kl._KL_REGISTRY[DELTA_KEY]
    assert pyro.settings.get("module_local_params") is False
    with pi.pyro_scope():
        assert pyro.settings.get("module_local_params") is True
        assert torch_kl._KL_REGISTRY[DELTA_KEY] is not pyro_rule
        with pi.pyro_scope():
            assert pyro.settings.get("module_local_params") is True
        assert pyro.settings.get("module_local_params") is True
    assert pyro.settings.get("module_local_params") is False
    assert torch_kl._KL_REGISTRY[DELTA_KEY] is pyro_rule
    with pytest.raises(RuntimeError):
        with pi.pyro_scope():
            raise RuntimeError("restored on errors too")
    assert pyro.settings.get("module_local_params") is False and torch_kl._KL_REGISTRY[DELTA_KEY] is pyro_rule


@pytest.fixture()
def clean_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _regression():
    model = pi.models.get("basis-regression", prior_scale=1.0, noise_scale=0.3)
    return model, guides.get("mean-field", model, init_scale=0.1)


def _classifier():
    """A small invariant MLP on 8×8 rotated digits (a classification model: ``pi.evaluate``)."""
    model = small_model()
    return model, guides.get("mean-field", model)


@pytest.fixture(scope="module")
def digits():
    return pi.load_dataset("rotated-digits", train_size=128, test_size=64)


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _holds_store_tensors(*modules) -> bool:
    """Every tensor in the global param store is one of the modules' own parameters."""
    store = pyro.get_param_store()
    own = {id(p) for m in modules for p in m.parameters()}
    return len(store) > 0 and all(id(store._params[name]) in own for name in store.keys())


def test_fit_trains_two_models_of_one_kind_without_sharing(clean_store):
    """Same parameter names, built outside the library's calls (Pyro's default global mode), fitted
    one after the other: each keeps its own parameters, and the global store stays empty."""
    x, y = make_symmetric_toy(40, seed=0, noise=0.3)
    (m1, g1), (m2, g2) = _regression(), _regression()
    pyro_rule, seen = torch_kl._KL_REGISTRY[DELTA_KEY], set()

    def during_fit(step, model, guide):
        seen.add((pyro.settings.get("module_local_params"), torch_kl._KL_REGISTRY[DELTA_KEY] is pyro_rule))

    pi.fit(m1, g1, (x, y), steps=30, batch_size=None, lr=0.05, progress=False, seed=1, callbacks=[during_fit])
    assert seen == {(True, False)}  # inside fit: module-local params and the corrected KL(Delta ‖ ·) ...
    assert (
        pyro.settings.get("module_local_params") is False and torch_kl._KL_REGISTRY[DELTA_KEY] is pyro_rule
    )  # ... only
    fitted1 = _params(g1)
    pi.fit(m2, g2, (x, y), steps=30, batch_size=None, lr=0.05, progress=False, seed=2)
    p1, p2 = _params(g1), _params(g2)
    assert list(p1) == list(p2) and p1  # the same names ...
    assert all(torch.equal(fitted1[k], p1[k]) for k in p1)  # ... fitting model 2 left model 1 alone
    assert any(not torch.equal(p1[k], p2[k]) for k in p2)
    assert not {id(p) for p in g1.parameters()} & {id(p) for p in g2.parameters()}
    assert len(pyro.get_param_store()) == 0  # the library's calls never use the global store
    assert pyro.settings.get("module_local_params") is False


def test_plain_pyro_svi_loop_then_library_evaluate(clean_store, digits):
    """Pyro's tutorial path on a catalogue model (SVI + pyro.optim.Adam + Trace_ELBO, the user did
    not opt in to anything): the parameters live in the global param store, and the library's
    functions evaluate exactly the trained modules, leaving store and parameters as they were."""
    model, guide = _classifier()
    x, y = train_arrays(digits, model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    for _ in range(5):
        svi.step(x[:64], y[:64], num_data=x.shape[0])
    store = pyro.get_param_store()
    assert any(name.startswith("MeanFieldNormal.") for name in store.keys())
    assert _holds_store_tensors(model, guide)  # the modules hold the very tensors SVI trained
    names, trained = list(store.keys()), _params(guide)
    metrics = pi.evaluate((model, guide), digits, num_samples=2, num_particles=1)
    assert set(metrics) >= {"accuracy", "nll"} and all(v == v for v in metrics.values())
    bounds = evidence_bounds(model, guide, x[:32], y[:32], Ks=(10,), num_samples=50)
    assert math.isfinite(bounds.elbo.value)
    assert list(pyro.get_param_store().keys()) == names and _holds_store_tensors(model, guide)
    assert all(torch.equal(trained[k], v) for k, v in _params(guide).items())
    svi.step(x[:64], y[:64], num_data=x.shape[0])  # and plain SVI goes on training the same tensors
    assert any(not torch.equal(trained[k], v) for k, v in _params(guide).items())


def test_library_fit_then_plain_predictive(clean_store, digits):
    """A model fitted by the library works with plain ``pyro.infer.Predictive`` (global mode):
    the modules register their own fitted values in the store, nothing is replaced."""
    model, guide = _classifier()
    result = pi.fit(model, guide, digits, steps=5, batch_size=64, progress=False)
    x, _ = train_arrays(digits, model)
    fitted = {**_params(model), **_params(guide)}
    with torch.no_grad():
        draws = Predictive(model, guide=guide, num_samples=3)(x[:16])
    assert draws["obs"].shape[:2] == (3, 16)
    assert _holds_store_tensors(model, guide)
    assert all(torch.equal(fitted[k], v) for k, v in {**_params(model), **_params(guide)}.items())
    metrics = pi.evaluate(result, digits, num_samples=2, num_particles=1)
    assert all(v == v for v in metrics.values())
