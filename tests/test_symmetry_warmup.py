"""Issue 15: the warm-up of q(θ | η) across a held q(η) (:func:`warm_up_conditional`) and the
symmetry-conditional guide's nonlinear dependence (``symmetry_dependence="rbf"``) and
``symmetry_init_scale``, on basis regression with λ latent (exact evidence ``log p(D | λ)``)."""

from __future__ import annotations

import copy
import math

import torch

torch.set_num_threads(1)

import pyro  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402
from torch.distributions import biject_to  # noqa: E402

from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry  # noqa: E402
from pyro_invariance.infer.symmetry_warmup import warm_up_conditional  # noqa: E402
from pyro_invariance.infer import symmetry_warmup  # noqa: E402
from small_runs import basis_lambda_conditional  # noqa: E402

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


def test_symmetry_init_scale_sets_q_lambda_only() -> None:
    _, guide, _, _ = _basis(symmetry_init_scale=WIDE)
    assert torch.allclose(guide.scales.lam, torch.tensor([WIDE]))
    assert torch.allclose(guide.scales.weight, torch.full((8,), 0.1))  # init_scale (default 0.1) elsewhere
    _, spline, _, _ = _basis(symmetry_density="spline", symmetry_init_scale=WIDE)
    assert torch.allclose(spline.conds.lam.scale, torch.tensor([WIDE]))
    with pytest.raises(ValueError, match="symmetry_dependence"):
        guides.get("symmetry-conditional", entry("basis-regression-lambda").build()[0], symmetry_dependence="cubic")


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


def _draw(guide, x, y, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    tr = poutine.trace(guide).get_trace(x, y)
    return {n: s["value"].detach() for n, s in tr.nodes.items() if s["type"] == "sample"}


def test_rbf_dependence_is_the_linear_guide_until_its_bumps_train_and_then_the_stated_shear() -> None:
    model, lin, x, y = _basis()
    _, rbf, _, _ = _basis(symmetry_dependence="rbf")
    with torch.no_grad():
        for g in (lin, rbf):
            g.locs.lam_unconstrained.fill_(-0.7)
            g.locs.weight_unconstrained.copy_(torch.linspace(-1, 1, 8))
        lin.deps.weight.lam.weight.copy_(torch.linspace(0.5, 2, 8)[:, None])
        rbf.deps.weight.lam.linear.weight.copy_(lin.deps.weight.lam.weight)
    a, b = _draw(lin, x, y, 3), _draw(rbf, x, y, 3)
    assert all(torch.allclose(a[k], b[k]) for k in a)  # C = 0: the same guide
    with torch.no_grad():
        rbf.deps.weight.lam.bumps.weight.normal_()
    d = _draw(rbf, x, y, 4)
    u = biject_to(poutine.trace(model).get_trace(x, y).nodes["lam"]["fn"].support).inv(d["lam"]).reshape(1)
    eps = d["weight_aux"]
    dep = rbf.deps.weight.lam
    m_eta = rbf.locs.lam_unconstrained
    psi = torch.exp(-0.5 * (u[..., None] - dep.centres) ** 2).flatten(-2)
    expected = (rbf.locs.weight_unconstrained + rbf.scales.weight * eps + dep.linear.weight @ (u - m_eta)
                + dep.bumps.weight @ psi)  # fmt: skip
    assert torch.allclose(d["weight"], expected.detach(), atol=1e-5)


def test_rbf_quantiles_are_monte_carlo_of_the_same_marginals() -> None:
    _, lin, x, y = _basis()
    _, rbf, _, _ = _basis(symmetry_dependence="rbf")
    with torch.no_grad():
        lin.deps.weight.lam.weight.fill_(0.8)
        rbf.deps.weight.lam.linear.weight.fill_(0.8)
    q = [0.1, 0.5, 0.9]
    exact, mc = lin.quantiles(q), rbf.quantiles(q)
    for site in exact:
        assert mc[site].shape == exact[site].shape
        # 4 standard errors of a 10 % quantile of a Normal of sd 1.28 from 8192 draws (0.024)
        assert torch.allclose(mc[site], exact[site], atol=0.1), site
    assert all(torch.equal(mc[k], v) for k, v in rbf.quantiles(q).items())  # seeded


def test_a_deep_copy_and_a_state_dict_carry_the_rbf_guide() -> None:
    _, rbf, x, y = _basis(symmetry_dependence="rbf")
    with torch.no_grad():
        rbf.deps.weight.lam.bumps.weight.normal_()
        rbf.locs.lam_unconstrained.fill_(0.4)
    twin = copy.deepcopy(rbf)
    assert twin.deps.weight.lam._guide is twin
    _, fresh, _, _ = _basis(symmetry_dependence="rbf")
    fresh.load_state_dict(rbf.state_dict())
    a = _draw(rbf, x, y, 5)
    assert all(torch.allclose(a[k], _draw(g, x, y, 5)[k]) for g in (twin, fresh) for k in a)
    with torch.no_grad():
        twin.locs.lam_unconstrained.fill_(-1.0)  # the copy's bumps follow the copy's m_λ
    assert not torch.allclose(_draw(twin, x, y, 5)["weight"], a["weight"])
