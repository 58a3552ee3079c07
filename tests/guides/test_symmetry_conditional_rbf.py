"""The symmetry-conditional guide's nonlinear dependence (``symmetry_dependence="rbf"``) and
``symmetry_init_scale``, on basis regression with λ latent."""

from __future__ import annotations

import copy
import math

import torch

torch.set_num_threads(1)

import pyro  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402
from small_runs import basis_lambda_conditional  # noqa: E402
from torch.distributions import biject_to  # noqa: E402

from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics.reference import entry  # noqa: E402

WIDE = math.pi / math.sqrt(3.0)


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


_basis = basis_lambda_conditional


def test_symmetry_init_scale_sets_q_lambda_only() -> None:
    _, guide, _, _ = _basis(symmetry_init_scale=WIDE)
    assert torch.allclose(guide.scales.lam, torch.tensor([WIDE]))
    assert torch.allclose(guide.scales.weight, torch.full((8,), 0.1))  # init_scale (default 0.1) elsewhere
    _, spline, _, _ = _basis(symmetry_density="spline", symmetry_init_scale=WIDE)
    assert torch.allclose(spline.conds.lam.scale, torch.tensor([WIDE]))
    with pytest.raises(ValueError, match="symmetry_dependence"):
        guides.get("symmetry-conditional", entry("basis-regression-lambda").build()[0], symmetry_dependence="cubic")


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
    expected = (
        rbf.locs.weight_unconstrained
        + rbf.scales.weight * eps
        + dep.linear.weight @ (u - m_eta)
        + dep.bumps.weight @ psi
    )
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
