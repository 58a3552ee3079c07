"""InvariantMLP (paper 003): shapes, invariance by construction, options and bad input."""

import math

import pytest
import torch
from pyro import poutine

import pyro_invariance as pi

torch.set_num_threads(1)


def _mlp(**kw):
    kw.setdefault("image_shape", (1, 8, 8))
    kw.setdefault("hidden", 32)
    kw.setdefault("num_transforms", 4)
    return pi.models.get("invariant-mlp", **kw)


def _images(n=6, seed=0):
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_forward_shapes_and_sites():
    model = _mlp(num_classes=7)
    x, y = _images(), torch.arange(6) % 7
    trace = poutine.trace(model).get_trace(x, y, num_data=60)
    assert trace.nodes["_RETURN"]["value"].shape == (6, 7)
    assert trace.nodes["out_weight"]["value"].shape == (7, 32)
    assert trace.nodes["out_bias"]["value"].shape == (7,)
    assert trace.nodes["prior_scale"]["value"].shape == ()
    assert trace.nodes["obs"]["scale"] == pytest.approx(10.0)  # N / B
    assert model(x.reshape(6, 64)).shape == (6, 7)  # flat inputs work too


@pytest.mark.parametrize("prior", ["hierarchical", "learned", "fixed"])
def test_priors(prior):
    model = _mlp(prior=prior, prior_scale=2.0)
    trace = poutine.trace(model).get_trace(_images())
    latent = {n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"]}
    assert ("prior_scale" in latent) == (prior == "hierarchical")
    if prior != "hierarchical":
        assert float(model.prior_scale.detach()) == pytest.approx(2.0)


def test_full_rotation_invariance_by_construction():
    """η = π with a fine deterministic grid over SO(2): logits of x and rot90(x) agree."""
    torch.manual_seed(0)
    model = _mlp(learn_symmetry=False, eta_init=math.pi, sampling="deterministic", num_transforms=257, hidden=64)
    x = torch.zeros(4, 1, 8, 8)
    x[:, :, 2:6, 2:6] = _images(4)[:, :, 2:6, 2:6]  # content away from the border
    rotated = torch.rot90(x, k=1, dims=(2, 3))
    guide_trace = poutine.trace(model).get_trace(x)
    a = poutine.replay(model, guide_trace)(x)
    b = poutine.replay(model, guide_trace)(rotated)
    assert torch.allclose(a, b, atol=0.02 * float(a.abs().max()))
    # while η = 0 is not invariant
    plain = _mlp(learn_symmetry=False, eta_init=0.0, hidden=64)
    t = poutine.trace(plain).get_trace(x)
    assert not torch.allclose(poutine.replay(plain, t)(x), poutine.replay(plain, t)(rotated), atol=0.05)


def test_weights_and_inputs_transforms_agree_for_right_angles():
    """Rotating weight rows or inputs by ±90° is exact on the grid; features must agree."""
    weights = _mlp(learn_symmetry=False, eta_init=math.pi / 2, sampling="deterministic", num_transforms=3)
    inputs = _mlp(learn_symmetry=False, eta_init=math.pi / 2, sampling="deterministic", num_transforms=3, transform_on="inputs")
    x = _images()
    assert torch.allclose(weights.features(x.reshape(6, 64)), inputs.features(x.reshape(6, 64)), atol=1e-5)


def test_eta_is_learnable_and_capped():
    model = _mlp(symmetry="affine", eta_init={"rot": 0.5})
    eta = model.symmetry_summary()
    assert list(eta) == ["tx", "ty", "rot", "sx", "sy", "shear"]
    assert float(eta["rot"]) == pytest.approx(0.5) and float(eta["tx"]) == pytest.approx(0.1)
    with torch.no_grad():
        model.eta_unit_unconstrained.fill_(50.0)
    assert float(model.eta[2].detach()) == pytest.approx(math.pi, abs=1e-5)  # rotation capped at π
    assert any(n.startswith("eta") for n, _ in model.named_parameters())


def test_relu_variant_learns_first_layer():
    model = _mlp(activation="relu")
    names = {n for n, _ in model.named_parameters()}
    assert {"w1", "b1"} <= names
    assert "w1" not in {n for n, _ in _mlp().named_parameters()}  # RFF keeps W1 fixed


def test_filter_bank_shape_and_identity_at_zero():
    model = _mlp(learn_symmetry=False, eta_init=0.0)
    bank = model.filter_bank([0, 3], num=5)
    assert bank.shape == (2, 5, 1, 8, 8)
    assert torch.allclose(bank[:, 0], bank[:, 4], atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_transforms": -1}, "num_transforms"),
        ({"num_transforms": 0}, "num_transforms"),
        ({"hidden": 0}, "hidden"),
        ({"num_classes": 1}, "num_classes"),
        ({"activation": "tanh"}, "unknown activation"),
        ({"prior": "flat"}, "unknown prior"),
        ({"sampling": "sobol"}, "unknown sampling"),
        ({"transform_on": "labels"}, "unknown transform_on"),
        ({"symmetry": "spin"}, "unknown symmetry"),
        ({"eta_init": 0.0}, "strictly inside"),
        ({"eta_init": 5.0}, "outside"),
        ({"eta_init": {"tx": 0.2}}, "not in the subgroup"),
        ({"lengthscale": -1.0}, "lengthscale"),
        ({"prior_scale": float("nan")}, "prior_scale"),
        ({"image_shape": (8, 8)}, "image_shape"),
    ],
)
def test_invalid_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _mlp(**kwargs)


def test_bad_inputs():
    model = _mlp()
    with pytest.raises(ValueError, match="x must have shape"):
        model(torch.zeros(3, 1, 7, 7))
    with pytest.raises(ValueError, match="integer class labels"):
        model(_images(), torch.zeros(6))
    with pytest.raises(ValueError, match="shape"):
        model(_images(), torch.zeros(5, dtype=torch.long))
    # values are checked once at the data boundary (prepare_inputs, called by fit / evaluate)
    x = _images()
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        model.prepare_inputs(x, None)
    with pytest.raises(ValueError, match="labels must lie"):
        model.prepare_inputs(_images(), torch.full((6,), 10))
    with pytest.raises(ValueError, match="x must have shape"):
        model.prepare_inputs(torch.zeros(3, 1, 7, 7), None)
