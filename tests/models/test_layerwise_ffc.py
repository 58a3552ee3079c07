"""The factored fully-connected pathway F-FC (paper 004 Eq. 5) at the start of training.

F-FC+CONV was seen to train worse than FC+CONV. These tests pin the properties of the start
that were checked while diagnosing it (they hold; the measured cause is the MAP objective with δ = 1
on *both* factors, a dead zone around θ₁θ₂ = 0 whose width shrinks with N; see docs/methods.md
§3, "F-FC under MAP at small N"): the F-FC pathway's output at a prior draw has the
FC pathway's scale, and at the equivariant start the product θ₁θ₂ is 0 while its output factor θ₁
still gets a gradient (with both factors at 0 neither would: the pathway could never turn on).
"""

from __future__ import annotations

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_invariance.models.layerwise import LayerwiseNet, make_init_loc_fn
from pyro_invariance.symmetry import equivariant_layers as L


def _second_moment(layer_cls: type, spec: L.BlockSpec, x: torch.Tensor, draws: int = 20) -> float:
    layer = layer_cls(spec, L.LayerOptions(), prior="fixed")
    total = 0.0
    for d in range(draws):
        pyro.set_rng_seed(d)
        with torch.no_grad():
            total += float(layer(x).square().mean())  # each access of a site is a fresh prior draw
    return total / draws


@pytest.mark.parametrize("c_in,hw,stride", [(1, 8, 1), (4, 8, 2), (8, 4, 2)])
def test_ffc_output_scale_matches_fc_at_a_prior_draw(c_in: int, hw: int, stride: int) -> None:
    """He-scaled factors: E[y²] of F-FC within a factor 1.5 of FC's weight term; both ≈ 2·E[x²]
    (FC's position-dependent bias adds its prior variance δ⁻¹ = 1)."""
    spec = L.BlockSpec(0, c_in, 1, hw, hw, 4, 1, stride)
    x = torch.rand(64, c_in, 1, hw, hw, generator=torch.Generator().manual_seed(0))
    ffc = _second_moment(L.FactoredFullyConnected, spec, x)
    fc = _second_moment(L.FullyConnected, spec, x)
    fc_weight = fc - 1.0  # minus the bias' variance
    he = 2.0 * float(x.square().mean())
    assert 1 / 1.5 < ffc / fc_weight < 1.5, (ffc, fc_weight)
    assert 1 / 1.5 < ffc / he < 1.5, (ffc, he)


def _start_values(model: LayerwiseNet, x: torch.Tensor, start: str) -> dict[str, torch.Tensor]:
    pyro.set_rng_seed(0)
    trace = poutine.trace(model).get_trace(x[:2])
    init = make_init_loc_fn(model.arch, start)
    return {
        name: init(site).detach().clone().requires_grad_(True)
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name.startswith(("blocks", "head"))
    }


def _grads(model: LayerwiseNet, values: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> None:
    with poutine.condition(data=values):
        logits = model(x)
    F.cross_entropy(logits, y).backward()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ffc_factors_get_a_gradient_at_the_equivariant_start(seed: int) -> None:
    torch.manual_seed(seed)
    model = LayerwiseNet("f-fc+conv", image_shape=(1, 8, 8), num_classes=4, alpha=1, prior="fixed")
    x, y = torch.rand(32, 1, 8, 8), torch.randint(0, 4, (32,))
    values = _start_values(model, x, "equivariant")
    _grads(model, values, x, y)
    for b in range(len(model.arch.blocks)):
        out, inp = values[f"blocks.{b}.ffc.weight_out"], values[f"blocks.{b}.ffc.weight_in"]
        assert torch.count_nonzero(out) == 0  # the pathway is off: the network starts equivariant
        assert inp.abs().mean() > 0.5  # the other factor is a prior draw, not 0 ...
        assert out.grad is not None and out.grad.abs().sum() > 0  # ... so the pathway can turn on


def test_ffc_with_both_factors_at_zero_has_no_gradient() -> None:
    """Why the start must not zero both factors: θ₁ = θ₂ = 0 is a stationary point of the likelihood."""
    torch.manual_seed(0)
    model = LayerwiseNet("f-fc+conv", image_shape=(1, 8, 8), num_classes=4, alpha=1, prior="fixed")
    x, y = torch.rand(32, 1, 8, 8), torch.randint(0, 4, (32,))
    values = _start_values(model, x, "equivariant")
    with torch.no_grad():
        for name, v in values.items():
            if ".ffc." in name:
                v.zero_()
    _grads(model, values, x, y)
    assert all(values[n].grad.abs().sum() == 0 for n in values if ".ffc." in n)
    assert values["blocks.0.conv.weight"].grad.abs().sum() > 0
