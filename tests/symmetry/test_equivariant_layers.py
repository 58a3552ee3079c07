"""Relaxed-equivariance layers (paper 004): equivariance, factorisation, sparse interpolation."""

import itertools
import math

import layerwise_reference as R
import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_invariance.symmetry import equivariant_layers as L

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    pyro.set_rng_seed(0)  # prior draws in these tests are reproducible


OPTS = L.LayerOptions()


def _frozen(module, *args):
    """``module`` with its sample sites fixed at one prior draw (replayed on every call)."""
    trace = poutine.trace(module).get_trace(*args)
    return poutine.replay(module, trace=trace), trace


def _x(shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _spec(c_in=3, c_out=4, h=8, w=8, stride=1, g_in=1, g_out=1):
    return L.BlockSpec(0, c_in, g_in, h, w, c_out, g_out, stride)


def _rot(x, k=1):
    """Rotate p4 maps (B, C, 4, H, W): spatially by k·90° and the group axis by k."""
    return torch.rot90(x, k, dims=(-2, -1)).roll(k, dims=2)


# --------------------------------------------------------------------------------------------
# translation


@pytest.mark.parametrize("kind", ["conv", "sconv"])
def test_convolutions_are_shift_equivariant(kind):
    layer = L.PATHWAYS[kind](_spec(), OPTS).double()
    x = _x((2, 3, 1, 8, 8))
    f, _ = _frozen(layer, x)
    y = f(x)
    for shift in [(1, 0), (0, 3), (5, 7)]:
        shifted = f(x.roll(shift, dims=(-2, -1)))
        assert torch.allclose(shifted, y.roll(shift, dims=(-2, -1)), atol=1e-12)


def test_fc_is_not_shift_equivariant():
    layer = L.FullyConnected(_spec(), OPTS).double()
    x = _x((2, 3, 1, 8, 8))
    f, _ = _frozen(layer, x)
    assert not torch.allclose(f(x.roll(1, dims=-1)), f(x).roll(1, dims=-1), atol=1e-3)


def test_polyphase_select_picks_largest_component():
    x = torch.zeros(2, 1, 4, 4)
    x[0, 0, 1::2, 0::2] = 3.0  # component (1, 0) -> index 2
    x[1, 0, 1::2, 1::2] = 1.0  # component (1, 1) -> index 3
    y, index = L.polyphase_select(x)
    assert index.tolist() == [2, 3]
    assert y.shape == (2, 1, 2, 2)
    assert torch.equal(y[0], torch.full((1, 2, 2), 3.0)) and torch.equal(y[1], torch.ones(1, 2, 2))
    assert torch.equal(L.polyphase_take(x, index), y)
    with pytest.raises(ValueError, match="even"):
        L.polyphase_select(torch.zeros(1, 1, 5, 4))


def _matching_shift(a, b):
    """The circular shift s with a == roll(b, s), or None."""
    h, w = b.shape[-2:]
    for s in itertools.product(range(h), range(w)):
        if torch.allclose(a, b.roll(s, dims=(-2, -1)), atol=1e-10):
            return s
    return None


def test_strided_conv_block_is_shift_equivariant_up_to_polyphase_choice():
    block = L.RelaxedBlock(_spec(stride=2), ("conv",), OPTS).double()
    x = _x((3, 3, 1, 8, 8), seed=1)
    f, _ = _frozen(block, x)
    y = f(x)
    assert y.shape == (3, 4, 1, 4, 4)
    for shift in [(2, 4), (2, 0), (6, 2)]:  # even shifts: output shifted by exactly half
        assert torch.allclose(f(x.roll(shift, dims=(-2, -1))), y.roll((shift[0] // 2, shift[1] // 2), dims=(-2, -1)))
    for shift in [(1, 0), (0, 1), (3, 5)]:  # odd shifts: a circular shift chosen by the polyphase selection
        shifted = f(x.roll(shift, dims=(-2, -1)))
        for n in range(3):  # per example: each picks its own component
            assert _matching_shift(shifted[n], y[n]) is not None


def test_polyphase_choice_is_per_example():
    """Examples do not influence each other: a batch gives the same output as single examples."""
    block = L.RelaxedBlock(_spec(stride=2), ("conv",), OPTS).double()
    x = _x((4, 3, 1, 8, 8), seed=2)
    f, _ = _frozen(block, x)
    y = f(x)
    for n in range(4):
        assert torch.allclose(f(x[n : n + 1]), y[n : n + 1])


def test_fixed_stride_subsampling_would_fail_odd_shifts():
    """Control: plain stride-2 subsampling of a convolution is not equivariant to a 1-px shift."""
    layer = L.Convolution(_spec(), OPTS).double()
    x = _x((1, 3, 1, 8, 8), seed=3)
    f, _ = _frozen(layer, x)
    y = f(x)[..., ::2, ::2]
    shifted = f(x.roll(1, dims=-1))[..., ::2, ::2]
    assert _matching_shift(shifted[0], y[0]) is None


# --------------------------------------------------------------------------------------------
# factored and sparse layers


def test_factored_fc_equals_dense_fc_with_factored_weight():
    spec = _spec(c_in=3, c_out=5, h=8, w=8, stride=2)
    ffc = L.FactoredFullyConnected(spec, OPTS).double()
    x = _x((4, 3, 1, 8, 8), seed=4)
    f, trace = _frozen(ffc, x)
    k, c, q, p = 5, 3, 16, 64
    theta1 = trace.nodes["weight_out"]["value"].reshape(k, c, q) * math.sqrt(2.0 / c)
    theta2 = trace.nodes["weight_in"]["value"].reshape(k, c, p) / math.sqrt(p)
    dense = torch.einsum("kcq,kcp->kqcp", theta1, theta2).reshape(k * q, c * p)  # θ(c′,c,q,p) = θ1·θ2
    expected = (x.reshape(4, -1) @ dense.T).reshape(4, 5, 1, 4, 4)
    assert torch.allclose(f(x), expected, atol=1e-12)
    # ... and the FC pathway with that weight (and zero bias) computes the same map
    fc = L.FullyConnected(spec, OPTS).double()
    gain = math.sqrt(2.0 / (c * p))
    fc_out = poutine.condition(fc, {"weight": dense / gain, "bias": torch.zeros(k * q, dtype=torch.float64)})(x)
    assert torch.allclose(fc_out, expected, atol=1e-12)
    assert L.FactoredFullyConnected.num_params(spec, OPTS) == k * c * (q + p)


def test_sparse_conv_with_anchors_on_the_whole_grid_is_a_dense_conv():
    spec = _spec()
    opts = L.LayerOptions(sconv_anchors=9, rbf_noise=1e-5)
    sconv = L.SparseConvolution(spec, opts).double()
    x = _x((2, 3, 1, 8, 8), seed=5)
    f, trace = _frozen(sconv, x)
    u = trace.nodes["weight"]["value"]  # (4, 3·9): anchor values in grid order
    conv = L.Convolution(spec, OPTS).double()
    dense = poutine.condition(conv, {"weight": u})(x)
    assert torch.allclose(f(x), dense, atol=1e-6)
    # with the paper's σ = 0.01 the filter is still within 1% of the anchor values
    basis = L.rbf_interpolation(L.grid_coordinates(3, 3, centred=True), L.grid_coordinates(3, 3, centred=True))
    assert torch.allclose(basis, torch.eye(9, dtype=torch.float64), atol=1e-2)
    assert not torch.allclose(basis, torch.eye(9, dtype=torch.float64), atol=1e-5)


def test_sparse_conv_with_seven_anchors_interpolates():
    sconv = L.SparseConvolution(_spec(), OPTS)
    assert sconv.basis.shape == (7, 9)
    assert L.SparseConvolution.site_shapes(_spec(), OPTS) == {"weight": (4, 3 * 7)}
    grid = L.grid_coordinates(3, 3, centred=True)
    idx = L.choose_anchors(9, 7, L._seed(OPTS, _spec(), 0))
    # at the anchors the filter reproduces the anchor values (up to σ² smoothing)
    assert torch.allclose(sconv.basis[:, idx], torch.eye(7), atol=2e-2)
    # the two other offsets get interpolated (non-zero) weights
    others = [i for i in range(9) if i not in idx.tolist()]
    assert sconv.basis[:, others].abs().sum(0).min() > 0.1
    assert torch.equal(L.choose_anchors(9, 7, 3), L.choose_anchors(9, 7, 3))  # seeded, fixed
    assert grid.shape == (9, 2)


def test_sparse_fc_is_a_factored_fc_with_interpolated_factors():
    spec = _spec(c_in=2, c_out=3, h=4, w=4, stride=2)
    sfc = L.SparseFullyConnected(spec, OPTS).double()
    assert sfc.basis_out.shape == (2, 4) and sfc.basis_in.shape == (8, 16)  # half of each grid
    x = _x((2, 2, 1, 4, 4), seed=6)
    f, trace = _frozen(sfc, x)
    u1 = trace.nodes["weight_out"]["value"].reshape(3, 2, 2)
    u2 = trace.nodes["weight_in"]["value"].reshape(3, 2, 8)
    theta1 = (u1 @ sfc.basis_out) * sfc.scale_out
    theta2 = (u2 @ sfc.basis_in) * sfc.scale_in
    dense = torch.einsum("kcq,kcp->kqcp", theta1, theta2).reshape(3 * 4, 2 * 16)
    assert torch.allclose(f(x), (x.reshape(2, -1) @ dense.T).reshape(2, 3, 1, 2, 2), atol=1e-12)


def test_rbf_interpolation_reproduces_values_at_anchors():
    grid = L.grid_coordinates(4, 4)
    idx = L.choose_anchors(16, 8, 0)
    basis = L.rbf_interpolation(grid[idx], grid, noise=1e-6)
    assert torch.allclose(basis[:, idx], torch.eye(8, dtype=torch.float64), atol=1e-8)


# --------------------------------------------------------------------------------------------
# p4 group convolution


def test_lifting_gconv_is_rotation_equivariant():
    layer = L.GroupConvolution(_spec(g_out=4), OPTS).double()
    x = _x((2, 3, 1, 8, 8), seed=7)
    f, _ = _frozen(layer, x)
    y = f(x)
    assert y.shape == (2, 4, 4, 8, 8)
    for k in (1, 2, 3):
        assert torch.allclose(f(torch.rot90(x, k, dims=(-2, -1))), _rot(y, k), atol=1e-12)


def test_group_gconv_is_rotation_and_shift_equivariant():
    layer = L.GroupConvolution(_spec(g_in=4, g_out=4), OPTS).double()
    assert L.GroupConvolution.site_shapes(_spec(g_in=4, g_out=4), OPTS) == {"weight": (4, 3 * 4 * 9)}
    x = _x((2, 3, 4, 8, 8), seed=8)
    f, _ = _frozen(layer, x)
    y = f(x)
    assert torch.allclose(f(_rot(x)), _rot(y), atol=1e-12)
    assert torch.allclose(f(x.roll((2, 3), dims=(-2, -1))), y.roll((2, 3), dims=(-2, -1)), atol=1e-12)
    # control: a plain convolution of p4 maps is not rotation-equivariant
    conv = L.Convolution(_spec(g_in=4, g_out=4), OPTS).double()
    g, _ = _frozen(conv, x)
    assert not torch.allclose(g(_rot(x)), _rot(g(x)), atol=1e-3)


def test_strided_gconv_block_is_rotation_equivariant():
    block = L.RelaxedBlock(_spec(g_in=4, g_out=4, stride=2), ("gconv",), OPTS).double()
    x = _x((2, 3, 4, 8, 8), seed=9)
    f, _ = _frozen(block, x)
    assert torch.allclose(f(_rot(x)), _rot(f(x)), atol=1e-12)


def test_gconv_rejects_bad_shapes():
    with pytest.raises(ValueError, match="square"):
        L.GroupConvolution(_spec(h=8, w=4, g_out=4), OPTS)
    with pytest.raises(ValueError, match="G = 4"):
        L.GroupConvolution(_spec(g_out=1), OPTS)


# --------------------------------------------------------------------------------------------
# the forward optimised for step time equals the direct formula (tests/layerwise_reference.py)


@pytest.mark.parametrize("shape, p", [((2, 3, 5, 6), 1), ((2, 3, 1, 1), 1), ((1, 2, 2, 3), 1), ((1, 2, 4, 5), 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_circular_pad_equals_f_pad_with_its_gradient(shape, p, dtype):
    x = _x(shape, seed=11, dtype=dtype).requires_grad_()
    g = _x((*shape[:-2], shape[-2] + 2 * p, shape[-1] + 2 * p), seed=12, dtype=dtype)
    ref = F.pad(x, (p, p, p, p), mode="circular")
    (gr,) = torch.autograd.grad(ref, x, g)
    out = L.circular_pad(x, p)
    (go,) = torch.autograd.grad(out, x, g)
    assert torch.equal(out, ref)
    assert torch.equal(go, gr)  # on CPU the same sums in the same order
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda t: L.circular_pad(t, p), (x,))
    with torch.no_grad():
        assert torch.equal(L.circular_pad(x, p), ref)


@pytest.mark.parametrize("shape", [(5, 3, 8, 8), (4, 2, 4, 6, 6), (3, 1, 1, 2, 2), (6, 7, 16, 4)])
def test_polyphase_select_equals_the_stacked_reference_exactly(shape):
    x = _x(shape, seed=13, dtype=torch.float32)
    x[0] = 1.0  # a tie between all four components: the first one wins in both
    x = x.requires_grad_()
    y, index = L.polyphase_select(x)
    y_ref, index_ref = R.polyphase_select(x)
    assert torch.equal(index, index_ref) and index[0] == 0
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(y_ref, x, g)[0])
    assert torch.equal(L.polyphase_take(x, index), y_ref)


BLOCK_CASES = [
    (("conv",), 1, 1),
    (("conv",), 2, 1),
    (("fc",), 2, 1),
    (("ffc",), 1, 1),
    (("fc", "conv"), 1, 1),
    (("fc", "conv"), 2, 1),
    (("ffc", "conv"), 1, 1),
    (("ffc", "conv"), 2, 1),
    (("sfc", "sconv"), 2, 1),
    (("conv", "sconv"), 2, 1),
    (("fc", "conv", "gconv"), 1, 1),
    (("fc", "conv", "gconv"), 2, 4),
    (("gconv",), 2, 4),
]


@pytest.mark.parametrize("kinds, stride, g_in", BLOCK_CASES)
def test_optimised_block_equals_the_reference_formula(kinds, stride, g_in):
    g_out = 4 if "gconv" in kinds else 1
    spec = L.BlockSpec(0, 3, g_in, 8, 8, 4, g_out, stride)
    block = L.RelaxedBlock(spec, kinds, OPTS).double()
    x = _x((3, 3, g_in, 8, 8), seed=14).requires_grad_()
    values = R.sample_sites(block, x)
    # sample sites in the order of the formula: equivariant pathways, the others, the bias
    order = sorted(kinds, key=lambda k: not L.PATHWAYS[k].equivariant)
    cls_sites = lambda k: [*L.PATHWAYS[k].weights, *L.PATHWAYS[k].biases]  # noqa: E731
    assert list(values) == [f"{k}.{n}" for k in order for n in cls_sites(k)] + ["bias"]
    leaves = {n: v.detach().requires_grad_() for n, v in values.items()}
    out = poutine.condition(block, data=leaves)(x)
    ref = R.block(block, x, leaves)
    assert out.shape == ref.shape == (3, 4, g_out, 8 // stride, 8 // stride)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    g = _x(out.shape, seed=15)
    inputs = [x, *leaves.values()]
    for a, b in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_single_pathway_forward_is_unchanged_by_the_block_fusions():
    """Each pathway's own ``forward`` still computes its formula (the block no longer calls it)."""
    x = _x((2, 3, 1, 8, 8), seed=16)
    for kind in ("fc", "conv", "ffc", "sconv", "sfc"):
        layer = L.PATHWAYS[kind](_spec(stride=2 if kind in ("fc", "ffc", "sfc") else 1), OPTS).double()
        values = R.sample_sites(layer, x)
        out = poutine.condition(layer, data=values)(x)
        assert torch.equal(out, R.pathway(layer, x, values)), kind


# --------------------------------------------------------------------------------------------
# priors and options


@pytest.mark.parametrize("prior", ["learned", "hierarchical", "fixed"])
def test_precision_priors(prior):
    layer = L.FactoredFullyConnected(_spec(), OPTS, prior=prior, precision_init=2.0)
    trace = poutine.trace(layer).get_trace(_x((1, 3, 1, 8, 8), dtype=torch.float32))
    weight = trace.nodes["weight_in"]
    assert weight["fn"].event_dim == 2 and weight["value"].shape == (4, 3 * 64)
    params = dict(layer.named_parameters())
    if prior == "learned":
        assert set(params) == {"precision_out_unconstrained", "precision_in_unconstrained"}
        assert torch.allclose(layer.precision_values(), torch.tensor([2.0, 2.0]))
        assert torch.allclose(weight["fn"].base_dist.scale, torch.tensor(2.0**-0.5))
    elif prior == "hierarchical":
        assert trace.nodes["precision_in"]["fn"].__class__.__name__ == "LogNormal"
        assert params == {}
    else:
        assert params == {} and "precision_in" not in trace.nodes


def test_layer_options_validation():
    with pytest.raises(ValueError, match="sconv_anchors"):
        L.LayerOptions(sconv_anchors=10)
    with pytest.raises(ValueError, match="sfc_anchor_fraction"):
        L.LayerOptions(sfc_anchor_fraction=0.0)
    with pytest.raises(ValueError, match="rbf_lengthscale"):
        L.LayerOptions(rbf_lengthscale=-1.0)
    with pytest.raises(ValueError, match="prior"):
        L.Convolution(_spec(), OPTS, prior="flat")
    with pytest.raises(ValueError, match="kinds"):
        L.RelaxedBlock(_spec(), ("conv", "conv"), OPTS)
    assert OPTS.sfc_anchors(1) == 1 and OPTS.sfc_anchors(4) == 2 and OPTS.sfc_anchors(1024) == 512
