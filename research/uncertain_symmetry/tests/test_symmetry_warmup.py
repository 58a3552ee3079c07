"""The warm-up of q(θ | η) across a held q(η) (:func:`warm_up_conditional`), on basis regression with λ
latent (exact evidence ``log p(D | λ)``). The guide options it relies on (``symmetry_dependence="rbf"``,
``symmetry_init_scale``) are tested with the library (``tests/guides/test_symmetry_conditional_rbf.py``)."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import pyro  # noqa: E402
import pytest  # noqa: E402

from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry  # noqa: E402
from research.uncertain_symmetry import symmetry_warmup  # noqa: E402
from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional  # noqa: E402
from research.uncertain_symmetry.tests.helpers import basis_lambda_conditional  # noqa: E402

WIDE = math.pi / math.sqrt(3.0)


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


_basis = basis_lambda_conditional


def test_warm_up_holds_q_lambda_trains_the_rest_and_restores_gradients() -> None:
    model, guide, x, y = _basis(symmetry_dependence="rbf", symmetry_init_scale=WIDE)
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    result = warm_up_conditional(model, guide, (x, y), steps=30, batch_size=None, seed=0, progress=False)
    after = guide.state_dict()
    held = {"locs.lam_unconstrained", "scales.lam_unconstrained"}
    assert {k for k in before if torch.equal(before[k], after[k])} == held | {"deps.weight.lam.centres"}
    assert all(p.requires_grad for p in guide.parameters())  # q(λ) trains again afterwards
    assert len(result.history["elbo"]) == 30 and all(math.isfinite(v) for v in result.history["elbo"])


def test_warm_up_refusals() -> None:
    model, x, y = entry("basis-regression-lambda").build()
    full = guides.get("full-rank", model)
    with pytest.raises(ValueError, match="no parameters of its own for site 'lam'"):
        warm_up_conditional(model, full, (x, y), steps=2, progress=False)
    fixed, xf, yf = entry("basis-regression").build()
    with pytest.raises(ValueError, match="no latent symmetry sites"):
        warm_up_conditional(fixed, guides.get("mean-field", fixed), (xf, yf), steps=2, progress=False)
    with pytest.raises(ValueError, match="catalogue guide"):
        warm_up_conditional(model, pyro.infer.autoguide.AutoNormal(model), (x, y), steps=2, progress=False)


@pytest.mark.parametrize("density", ["normal", "spline"])
def test_widen_holds_q_lambda_wider_during_the_fit_and_restores_it(monkeypatch, density: str) -> None:
    model, guide, x, y = _basis(symmetry_density=density)
    module, leaf = symmetry_warmup.symmetry_scales(guide, ["lam"])[0]
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    start = getattr(module, leaf).detach().clone()
    seen = {}

    def spy(model, guide, data, **settings):
        seen["scale"] = getattr(module, leaf).detach().clone()
        seen["frozen"] = not getattr(module, f"{leaf}_unconstrained").requires_grad
        seen["settings"] = settings
        return "result"

    monkeypatch.setattr(symmetry_warmup, "fit", spy)
    assert warm_up_conditional(model, guide, (x, y), widen=3.0, steps=7, progress=False) == "result"
    assert torch.allclose(seen["scale"], 3.0 * start) and seen["frozen"]
    assert seen["settings"] == {"steps": 7, "progress": False}  # widen is not passed on to fit
    after = guide.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # q(λ) restored exactly (the spy trained nothing)
    assert all(p.requires_grad for p in guide.parameters())


def test_widened_warm_up_trains_the_conditional_across_the_wider_q_lambda() -> None:
    runs = {}
    for widen in (1.0, 4.0):
        pyro.clear_param_store()
        model, guide, x, y = _basis()
        held = {k: v.detach().clone() for k, v in guide.state_dict().items() if k.endswith("lam_unconstrained")}
        warm_up_conditional(model, guide, (x, y), widen=widen, steps=30, batch_size=None, seed=0, progress=False)
        after = guide.state_dict()
        assert all(torch.equal(held[k], after[k]) for k in held)
        runs[widen] = after["deps.weight.lam.weight"].clone()
    assert not torch.equal(runs[1.0], runs[4.0])  # the conditional saw other draws of λ


def test_widen_refusals() -> None:
    model, guide, x, y = _basis()
    for bad in (0.0, -2.0, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ValueError, match="widen must be a positive finite number"):
            warm_up_conditional(model, guide, (x, y), widen=bad, steps=1, progress=False)
    with pytest.raises(ValueError, match="no scale of q"):
        symmetry_warmup.symmetry_scales(guide, ["weight_missing"])
