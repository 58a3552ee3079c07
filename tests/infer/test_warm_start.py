"""The 3-body recipe's options: warm start from a trained HNN
(``pyro_invariance/infer/warm_start.py``) and the closed-form prior update after every step as a
``fit`` callback (``ClosedFormPriorUpdate``), resuming bit-for-bit."""

from __future__ import annotations

import pyro
import pytest
import torch

from pyro_invariance import guides
from pyro_invariance.infer import fit
from pyro_invariance.infer.prior_update import ClosedFormPriorUpdate
from pyro_invariance.infer.warm_start import warm_start
from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN

torch.set_num_threads(1)
SMALL = dict(hidden=(8, 8), num_transforms=4, euler_steps=2)


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=gen)
    return x, x + 0.1 * torch.randn(24, 4, generator=gen)


@pytest.fixture(scope="module")
def hnn_run(data, tmp_path_factory):
    pyro.set_rng_seed(0)
    model = SymmetrisedHNN(4, symmetry="none", **SMALL)
    guide = guides.get("matrix-normal", model, init_scale=0.01)
    path = tmp_path_factory.mktemp("warm") / "hnn.pt"
    result = fit(model, guide, data, steps=20, batch_size=None, progress=False, seed=0, checkpoint_path=path)
    return result, path


def _fresh(data, symmetry="quadratic", **kw):
    model = SymmetrisedHNN(4, symmetry=symmetry, num_generators=2, **dict(SMALL, **kw))
    guide = guides.get("matrix-normal", model, init_scale=0.5)
    with pyro.poutine.block():
        guide(*data)
    return model, guide


@pytest.mark.parametrize("from_checkpoint", [False, True])
def test_warm_start_copies_means_and_point_estimates_not_symmetry_or_scales(data, hnn_run, from_checkpoint):
    result, path = hnn_run
    model, guide = _fresh(data)
    eta = [p.detach().clone() for p in model.symmetry_parameters()]
    scales_before = {k: v.clone() for k, v in guide.state_dict().items() if "scale" in k}
    report = warm_start(model, guide, path if from_checkpoint else result)
    src = result.guide.state_dict()
    for name in report.guide:
        assert name.endswith("loc_unconstrained") and torch.equal(guide.state_dict()[name], src[name])
    assert len(report.guide) == 3  # one mean per weight matrix
    assert {"bias_0", "bias_1", "input_scale"} <= set(report.model)
    assert torch.equal(model.bias_0, result.model.bias_0)
    assert all(torch.equal(a, b) for a, b in zip(eta, model.symmetry_parameters()))  # η keeps its own start
    assert all(torch.equal(guide.state_dict()[k], v) for k, v in scales_before.items())  # scales: init_scale


def test_warm_start_refuses_what_cannot_match(data, hnn_run):
    result, _ = hnn_run
    model = SymmetrisedHNN(4, symmetry="quadratic", **SMALL)
    with pytest.raises(ValueError, match="pass the training data"):
        warm_start(model, guides.get("matrix-normal", model), result)
    other, guide = _fresh(data, hidden=(5, 5))
    with pytest.raises(ValueError, match="no guide mean matched"):
        warm_start(other, guide, result)
    with pytest.raises(TypeError, match="FitResult or a checkpoint path"):
        warm_start(*_fresh(data), source=42)


def test_warm_start_sets_a_fresh_guide_up_on_the_data(data, hnn_run):
    """``warm_start(..., data)`` creates the guide's parameters as the explicit set-up call does
    (same random state: the same initial values), then copies the means."""
    result, _ = hnn_run
    states = []
    for explicit in (True, False):
        pyro.set_rng_seed(4)
        model = SymmetrisedHNN(4, symmetry="quadratic", num_generators=2, **SMALL)
        guide = guides.get("matrix-normal", model, init_scale=0.5)
        if explicit:
            with pyro.poutine.block():
                guide(data[0][:2], data[1][:2], num_data=data[0].shape[0])
            report = warm_start(model, guide, result)
        else:
            report = warm_start(model, guide, result, data)
        states.append((report, guide.state_dict()))
    (r1, s1), (r2, s2) = states
    assert r1 == r2 and r1.guide and s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_warm_started_closed_form_run_resumes_bit_for_bit(data, hnn_run, tmp_path):
    """Warm start, the closed-form prior update after every step (past a warm-up), checkpoint at
    step 6 of 12, resume: the same history and state as the uninterrupted run."""
    result, _ = hnn_run
    runs = []
    for split in (False, True):
        pyro.clear_param_store()
        model, guide = _fresh(data, prior="closed-form")
        warm_start(model, guide, result)
        kw = dict(steps=12, batch_size=None, progress=False, seed=3, callbacks=[ClosedFormPriorUpdate(0.5, warmup=2)])
        if split:
            path = tmp_path / "cf.pt"
            fit(model, guide, data, checkpoint_path=path, until_step=6, **kw)
            model, guide = _fresh(data, prior="closed-form")
            runs.append(fit(model, guide, data, checkpoint_path=path, resume=True, **kw))
        else:
            runs.append(fit(model, guide, data, **kw))
    a, b = runs
    assert a.history["elbo"] == b.history["elbo"]
    assert not torch.equal(a.model.prior_var, torch.ones_like(a.model.prior_var))  # the update ran
    for x, y in ((a.model.state_dict(), b.model.state_dict()), (a.guide.state_dict(), b.guide.state_dict())):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_closed_form_callback_checks_its_settings_and_the_model(data):
    with pytest.raises(ValueError, match="damping"):
        ClosedFormPriorUpdate(0.0)
    with pytest.raises(ValueError, match="warmup"):
        ClosedFormPriorUpdate(0.5, warmup=-1)
    model, guide = _fresh(data)  # prior="fixed"
    with pytest.raises(ValueError, match="closed-form"):
        fit(model, guide, data, steps=2, batch_size=None, progress=False, callbacks=[ClosedFormPriorUpdate()])
