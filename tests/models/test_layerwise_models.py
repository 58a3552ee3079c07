"""layerwise-* models (paper 004): parameter counts, invariance of the whole network, interface, errors."""

import math

import layerwise_reference as R
import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.optim import Adam

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.infer.training import is_symmetry_parameter
from pyro_invariance.models.layerwise import LayerwiseNet, count_parameters, resolve_strides
from pyro_invariance.registry import UnknownNameError

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    pyro.set_rng_seed(0)  # prior draws in these tests are reproducible


REGISTERED = ["fc", "conv", "fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv"]


def _images(n=4, shape=(1, 16, 16), seed=0, dtype=torch.float64):
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _latent_sizes(trace):
    return {
        name: site["value"].numel()
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and type(site["fn"]).__name__ != "_Subsample"
    }


def _assert_not_constant(logits):
    """The features are alive: different images give different logits (an invariance test on a
    network whose ReLUs are all off would pass trivially)."""
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)


def _with_zero(model, x, sites):
    """The model at one prior draw, with the named sites set to zero."""
    trace = poutine.trace(model).get_trace(x)
    for name in sites:
        trace.nodes[name]["value"] = torch.zeros_like(trace.nodes[name]["value"])
    return poutine.replay(model, trace=trace)


# --------------------------------------------------------------------------------------------
# parameter counts


@pytest.mark.parametrize(
    "variant, paper_millions",
    [
        ("fc", 133.6),
        ("conv", 0.34),
        ("fc+conv", 133.9),
        ("f-fc", 1.54),
        ("f-fc+conv", 1.77),
        ("s-fc+s-conv", 0.93),
    ],
)
def test_parameter_counts_match_the_paper_at_alpha_10(variant, paper_millions):
    count = count_parameters(variant, 10, (3, 32, 32), 10)
    digits = 1 if paper_millions > 100 else 2
    assert round(count / 1e6, digits) == paper_millions


def test_parameter_count_components():
    conv = count_parameters("conv", 10, (3, 32, 32), 10)
    head = 160 * 640 + 640 + 640 * 10 + 10
    weights = 9 * (3 * 10 + 10 * 20 + 20 * 20 + 20 * 40 + 40 * 40 + 40 * 80 + 80 * 80 + 80 * 160)
    assert conv == weights + 450 + head  # 3×3 filters, one bias per channel, the two head layers
    assert count_parameters("f-fc+conv", 10, (3, 32, 32), 10) == count_parameters("f-fc", 10, (3, 32, 32), 10) + weights


@pytest.mark.parametrize("variant", REGISTERED + ["f-fc", "s-fc", "s-conv", "f-fc+conv+gconv"])
def test_analytic_count_equals_instantiated_sites(variant):
    model = LayerwiseNet(variant, image_shape=(1, 16, 16), num_classes=10, alpha=1)
    x, y = _images(2, dtype=torch.float32), torch.tensor([0, 1])
    sizes = _latent_sizes(poutine.trace(model).get_trace(x, y))
    assert sum(sizes.values()) == count_parameters(variant, 1, (1, 16, 16), 10) == model.num_parameters()
    assert {k: math.prod(v) for k, v in model.site_shapes().items()} == sizes


def test_counts_follow_alpha_input_and_classes():
    small = count_parameters("f-fc+conv", 2, (1, 16, 16), 10)
    assert count_parameters("f-fc+conv", 4, (1, 16, 16), 10) > small
    assert count_parameters("f-fc+conv", 2, (3, 16, 16), 10) > small
    assert count_parameters("f-fc+conv", 2, (1, 16, 16), 40) == small + 30 * 128 + 30


# --------------------------------------------------------------------------------------------
# forward and sites


@pytest.mark.parametrize("variant", REGISTERED)
def test_registered_models_forward(variant):
    model = pi.models.get(f"layerwise-{variant}", image_shape=(1, 16, 16), num_classes=7)
    x, y = _images(3, dtype=torch.float32), torch.tensor([0, 3, 6])
    trace = poutine.trace(model).get_trace(x, y, num_data=30)
    assert trace.nodes["_RETURN"]["value"].shape == (3, 7)
    assert trace.nodes["obs"]["scale"] == pytest.approx(10.0)
    for name, shape in model.site_shapes().items():
        site = trace.nodes[name]
        assert site["value"].shape == shape and site["fn"].event_dim == len(shape)
        if len(shape) == 2:  # every weight is a matrix site for the structured guides
            assert guides.is_matrix_site(site), name
    assert torch.isfinite(trace.log_prob_sum())


@pytest.mark.parametrize("variant", REGISTERED)
def test_optimised_network_equals_the_reference_formula(variant):
    """Logits and gradients of the optimised forward (fused filters and bias, folded 1/√K, gathered
    polyphase component, lean circular padding) equal the direct formula (tests/layerwise_reference.py)."""
    model = LayerwiseNet(variant, image_shape=(2, 16, 16), num_classes=5, alpha=1, prior="fixed").double()
    x, y = _images(3, shape=(2, 16, 16)), torch.tensor([0, 2, 4])
    values = R.sample_sites(model, x, y)  # a prior draw, biases at 0 (N(0, 1) biases kill the ReLUs)
    leaves = {
        n: (torch.zeros_like(v) if n.endswith("bias") else v.detach()).requires_grad_() for n, v in values.items()
    }
    logits = poutine.condition(model, data=leaves)(x, y)
    ref = R.network_logits(model, x, leaves)
    assert torch.allclose(logits, ref, rtol=1e-10, atol=1e-12)
    _assert_not_constant(logits)
    g = torch.randn(logits.shape, dtype=logits.dtype, generator=torch.Generator().manual_seed(1))
    inputs = list(leaves.values())
    for name, a, b in zip(leaves, torch.autograd.grad(logits, inputs, g), torch.autograd.grad(ref, inputs, g)):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), name


def test_site_order_is_the_formula_order_with_hierarchical_precisions():
    """Guides and init_loc_fn draw sites in trace order: equivariant pathways first, then the
    others, then the bias, each weight right after its (hierarchical) precision."""
    model = LayerwiseNet("fc+conv", image_shape=(1, 8, 8), alpha=1, prior="hierarchical")
    names = list(R.sample_sites(model, _images(2, shape=(1, 8, 8), dtype=torch.float32)))
    block0 = [n.removeprefix("blocks.0.") for n in names if n.startswith("blocks.0.")]
    assert block0 == ["conv.precision", "conv.weight", "fc.precision", "fc.weight", "fc.bias", "bias_precision", "bias"]


def test_strides_auto():
    assert resolve_strides("auto", 32, 32) == (1, 2, 1, 2, 1, 2, 2, 2)
    assert resolve_strides("auto", 16, 16) == (1, 2, 1, 2, 1, 2, 2, 1)
    assert resolve_strides("auto", 28, 28) == (1, 2, 1, 2, 1, 1, 1, 1)
    assert resolve_strides("auto", 7, 7) == (1,) * 8
    assert LayerwiseNet("conv", image_shape=(1, 8, 8), alpha=1).arch.head_in == 16  # 8×8 ends at 1×1
    assert LayerwiseNet("conv", image_shape=(1, 28, 28), alpha=1).arch.head_in == 16 * 7 * 7


# --------------------------------------------------------------------------------------------
# symmetry of whole networks


SHIFTS = [(1, 0), (0, 1), (3, 5), (8, 8), (15, 2)]


def test_conv_network_is_invariant_to_all_circular_shifts():
    """Stride-1 layers are shift-equivariant and polyphase stride-2 layers equivariant up to the
    polyphase choice; the 16×16 input ends at 1×1, so the logits are invariant to every shift."""
    model = LayerwiseNet("conv", image_shape=(1, 16, 16), alpha=2).double()
    x = _images(3)
    f = _with_zero(model, x, [])
    logits = f(x)
    _assert_not_constant(logits)
    for shift in SHIFTS:
        assert torch.allclose(f(x.roll(shift, dims=(-2, -1))), logits, atol=1e-10)


def test_fc_conv_network_with_fc_at_zero_is_shift_invariant_and_not_otherwise():
    model = LayerwiseNet("fc+conv", image_shape=(1, 16, 16), alpha=2).double()
    x = _images(3, seed=1)
    fc_sites = [s for p in model.pathways() if p.kind == "fc" for s in p.sites + p.bias_sites]
    assert len(fc_sites) == 16
    zero = _with_zero(model, x, fc_sites)
    full = _with_zero(model, x, [])
    _assert_not_constant(zero(x))
    for shift in SHIFTS:
        shifted = x.roll(shift, dims=(-2, -1))
        assert torch.allclose(zero(shifted), zero(x), atol=1e-10)
        assert not torch.allclose(full(shifted), full(x), atol=1e-3)


def test_gconv_network_with_fc_and_conv_at_zero_is_rotation_invariant():
    model = LayerwiseNet("fc+conv+gconv", image_shape=(1, 16, 16), alpha=2).double()
    x = _images(2, seed=2)
    sites = [s for p in model.pathways() if p.kind in ("fc", "conv") for s in p.sites + p.bias_sites]
    zero = _with_zero(model, x, sites)
    full = _with_zero(model, x, [])
    logits = zero(x)
    _assert_not_constant(logits)
    for k in (1, 2, 3):
        rotated = torch.rot90(x, k, dims=(-2, -1))
        assert torch.allclose(zero(rotated), logits, atol=1e-10)
        assert not torch.allclose(full(rotated), full(x), atol=1e-3)
    assert torch.allclose(zero(x.roll((3, 1), dims=(-2, -1))), logits, atol=1e-10)
    # a CONV network is shift- but not rotation-invariant
    conv = _with_zero(LayerwiseNet("conv", image_shape=(1, 16, 16), alpha=2).double(), x, [])
    _assert_not_constant(conv(x))
    assert not torch.allclose(conv(torch.rot90(x, 1, dims=(-2, -1))), conv(x), atol=1e-3)


# --------------------------------------------------------------------------------------------
# analysis interface and priors


def test_pathways_and_prior_precision():
    model = LayerwiseNet("f-fc+conv", image_shape=(1, 16, 16), alpha=1)
    paths = model.pathways()
    assert [(p.block, p.kind) for p in paths[:4]] == [(0, "ffc"), (0, "conv"), (1, "ffc"), (1, "conv")]
    assert [(p.block, p.kind) for p in paths[-2:]] == [(8, "head"), (9, "head")]
    assert len(paths) == 18
    ffc = paths[0]
    assert ffc.sites == ["blocks.0.ffc.weight_out", "blocks.0.ffc.weight_in"]
    assert ffc.num_params == 1 * 1 * (256 + 256)  # α = 1: one channel in, one out
    assert paths[1].sites == ["blocks.0.conv.weight"] and paths[1].num_params == 9 * 1 * 1
    assert paths[-1].sites == ["head.1.weight"] and paths[-1].bias_sites == ["head.1.bias"]
    shapes = model.site_shapes()
    for p in paths:
        assert p.num_params == sum(math.prod(shapes[s]) for s in p.sites)
        delta = model.prior_precision(p.block, p.kind)
        assert delta.shape == (len(p.sites),) and torch.allclose(delta, torch.ones(len(p.sites)))
    with pytest.raises(ValueError, match="not 'fc'"):
        model.prior_precision(0, "fc")
    with pytest.raises(ValueError, match="block"):
        model.prior_precision(8, "conv")
    with pytest.raises(ValueError, match="head"):
        model.prior_precision(3, "head")
    assert set(model.symmetry_summary()) == {f"delta.{b}.{k}" for b in range(8) for k in ("ffc.out", "ffc.in", "conv")}


def test_learned_precisions_are_trained_with_eta_lr():
    model = LayerwiseNet("fc+conv", image_shape=(1, 8, 8), alpha=1)
    names = [n for n, _ in model.named_parameters()]
    assert names and all(is_symmetry_parameter(model, p) for p in model.parameters())
    assert len(model.symmetry_parameters()) == len(names)
    assert "blocks.0.fc.precision_unconstrained" in names and "blocks.0.bias_precision_unconstrained" in names


def test_hierarchical_prior_needs_the_guide_for_precisions():
    model = LayerwiseNet("conv", image_shape=(1, 8, 8), alpha=1, prior="hierarchical")
    x = _images(2, shape=(1, 8, 8), dtype=torch.float32)
    trace = poutine.trace(model).get_trace(x)
    assert type(trace.nodes["blocks.3.conv.precision"]["fn"]).__name__ == "LogNormal"
    assert list(model.parameters()) == [] and model.symmetry_summary() == {} and model.symmetry_parameters() == []
    with pytest.raises(ValueError, match="guide"):
        model.prior_precision(3, "conv")
    guide = guides.get("mean-field", model)
    guide(x, torch.tensor([0, 1]))
    delta = model.prior_precision(3, "conv", guide=guide)
    assert delta.shape == (1,) and torch.allclose(delta, torch.ones(1))  # median exp(0) at init
    dims = model.arviz_dims()
    assert dims["blocks.3.conv.precision"] == [] and dims["blocks.3.conv.weight"] == [
        "blocks.3.conv.weight.out",
        "blocks.3.conv.weight.in",
    ]


def test_fixed_prior_has_no_parameters():
    model = LayerwiseNet("s-fc+s-conv", image_shape=(1, 8, 8), alpha=1, prior="fixed", prior_scale=0.5)
    assert list(model.parameters()) == []
    assert torch.allclose(model.prior_precision(2, "sfc"), torch.full((2,), 4.0))


@pytest.mark.parametrize("guide_name, kwargs", [("matrix-normal", {"diagonal_factors": 512}), ("mean-field", {})])
def test_svi_steps_with_structured_and_mean_field_guides(guide_name, kwargs):
    model = LayerwiseNet("fc+conv", image_shape=(1, 8, 8), alpha=1)
    guide = guides.get(guide_name, model, **kwargs)
    x, y = _images(16, shape=(1, 8, 8), dtype=torch.float32), torch.arange(16) % 10
    svi = SVI(model, guide, Adam({"lr": 1e-2}), TraceMeanField_ELBO())
    losses = [svi.step(x, y, num_data=100) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)
    assert any(n.endswith("fc.precision_unconstrained") for n, _ in model.named_parameters())


# --------------------------------------------------------------------------------------------
# bad input


def test_bad_input_raises_clear_errors():
    model = LayerwiseNet("conv", image_shape=(1, 16, 16), alpha=1)
    with pytest.raises(ValueError, match=r"\(B, 1, 16, 16\)"):
        model(torch.rand(2, 3, 16, 16))  # wrong channels
    with pytest.raises(ValueError, match=r"\(B, 1, 16, 16\)"):
        model(torch.rand(2, 1, 8, 8))  # wrong size
    # values are checked once at the data boundary (prepare_inputs, called by fit / evaluate)
    with pytest.raises(ValueError, match="non-finite"):
        model.prepare_inputs(torch.full((1, 1, 16, 16), float("nan")), None)
    with pytest.raises(ValueError, match="labels"):
        model.prepare_inputs(torch.rand(2, 1, 16, 16), torch.tensor([0, 10]))
    with pytest.raises(ValueError, match=r"\(B, 1, 16, 16\)"):
        model.prepare_inputs(torch.rand(2, 1, 8, 8), None)
    with pytest.raises(UnknownNameError, match="layerwise-conv"):
        pi.models.get("layerwise-cnv")
    with pytest.raises(ValueError, match="unknown pathway"):
        LayerwiseNet("fc+deconv")
    for alpha in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="alpha"):
            LayerwiseNet("conv", alpha=alpha)
    with pytest.raises(ValueError, match="divisible by the total stride 32"):
        LayerwiseNet("conv", image_shape=(1, 16, 16), strides=(1, 2, 1, 2, 1, 2, 2, 2))
    with pytest.raises(ValueError, match="strides"):
        LayerwiseNet("conv", strides=(1, 3, 1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="image_shape"):
        LayerwiseNet("conv", image_shape=(16, 16))
    with pytest.raises(ValueError, match="square"):
        LayerwiseNet("gconv", image_shape=(1, 16, 8))
    with pytest.raises(ValueError, match="prior"):
        LayerwiseNet("conv", prior="flat")
    with pytest.raises(ValueError, match="f-fc"):  # 52M-element dense FC on CIFAR at α = 10
        LayerwiseNet("fc+conv", image_shape=(3, 32, 32), alpha=10)
