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
    """Rotating weight rows by ±90° (or inputs by ∓90°) is exact on the grid; features must agree."""
    weights = _mlp(
        learn_symmetry=False, eta_init=math.pi / 2, sampling="deterministic", num_transforms=3, transform_on="weights"
    )
    inputs = _mlp(
        learn_symmetry=False, eta_init=math.pi / 2, sampling="deterministic", num_transforms=3, transform_on="inputs"
    )
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


# --- transform path: warp the weight rows or the inputs (paper 003, Sec. 3.2) ----------------
def _blobs(n, side, seed):
    """Smooth images: sums of three Gaussian bumps (σ ≥ 0.15 of the half-side) of random sign, centred
    inside the middle 80% of the image so that warps keep them away from the zero padding."""
    g = torch.Generator().manual_seed(seed)
    c = torch.linspace(-1, 1, side)
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    out = torch.zeros(n, 1, side, side)
    for i in range(n):
        for _ in range(3):
            mx, my = ((torch.rand(2, generator=g) - 0.5) * 0.8).tolist()
            sd = 0.15 + 0.2 * float(torch.rand(1, generator=g))
            amp = 2 * float(torch.rand(1, generator=g)) - 1
            out[i, 0] += amp * torch.exp(-((xx - mx) ** 2 + (yy - my) ** 2) / (2 * sd**2))
    return out.reshape(n, -1)


def _path_pair(side, symmetry, eta, **kw):
    """Two identical ReLU models (same smooth W1, b1, η) differing only in ``transform_on``."""
    kw = {
        "image_shape": (1, side, side),
        "hidden": 16,
        "activation": "relu",
        "symmetry": symmetry,
        "learn_symmetry": False,
        "eta_init": eta,
        "sampling": "deterministic",
        "num_transforms": 9,
        **kw,
    }
    weights, inputs = _mlp(transform_on="weights", **kw), _mlp(transform_on="inputs", **kw)
    with torch.no_grad():
        weights.w1.copy_(_blobs(16, side, seed=1))
        weights.b1.copy_(torch.linspace(-0.5, 0.5, 16))
        inputs.load_state_dict(weights.state_dict())
    return weights, inputs


def _path_error(side, symmetry, eta):
    weights, inputs = _path_pair(side, symmetry, eta)
    x = _blobs(5, side, seed=2)
    with torch.no_grad():
        hw, hi = weights.features(x), inputs.features(x)
    return float((hw - hi).abs().max() / hw.abs().max())


@pytest.mark.parametrize("symmetry, eta", [("rotation", 1.0), ("scale", 0.4), ("shear", 0.3), ("rotation+scale", 0.5)])
def test_weights_and_inputs_paths_agree_to_interpolation_accuracy(symmetry, eta):
    """⟨x, w∘T⟩ = |det T|⁻¹⟨x∘T⁻¹, w⟩ in the continuum; with bilinear warps of smooth images (smooth
    x and W1) the paths differ only by interpolation error, O(h²) in the pixel size h. Allowed: 1%
    of the largest feature at 16×16 (measured: rotation 0.06%, shear 0.05%, scale 0.13%,
    rotation+scale 0.28%), and at least 2.5× less at 32×32 (4× for O(h²); measured 3.8× to 19×).
    A missing Jacobian |det T|⁻¹ (scale) or a mismatch of T and T⁻¹ would not shrink with h. ReLU
    features are 1-Lipschitz in the pre-activations, so this bounds those too."""
    coarse, fine = _path_error(16, symmetry, eta), _path_error(32, symmetry, eta)
    assert coarse < 0.01, coarse
    assert fine < coarse / 2.5, (coarse, fine)


def test_paths_pair_the_same_draws_exactly_for_translations():
    """A bilinear shift's adjoint is the opposite bilinear shift (zero padding included), so for
    translations the paths agree to rounding, with white-noise W1 (RFF) and stochastic ε: each
    draw ε_s is used by both paths for the same T_s, not merely in distribution."""
    kw = dict(symmetry="translation", learn_symmetry=False, eta_init=0.37, num_transforms=5)
    weights, inputs = _mlp(transform_on="weights", **kw), _mlp(transform_on="inputs", **kw)
    x = _images(6).reshape(6, 64)
    torch.manual_seed(3)
    hw = weights.features(x)
    torch.manual_seed(3)
    hi = inputs.features(x)
    torch.testing.assert_close(hw, hi, atol=1e-5, rtol=1e-4)


def test_white_noise_rff_rows_are_low_passed_by_the_weights_path():
    """Documents the size of "up to interpolation" for the default RFF W1 (white noise, not smooth):
    warping the rows off the grid averages neighbouring entries (variance × ≈0.44,
    tests/symmetry/test_symmetry.py), warping the smooth inputs does not. At ε = ±1 with η = 1 rad on 8×8
    the pre-activations differ by ≈10% of their scale and the averaged RFF features by ≈15% of the
    largest (measured); at ε = 0 (the identity) the paths are the same to rounding."""
    x = _blobs(4, 8, seed=4)
    for num, low, high in ((1, 0.0, 1e-5), (3, 0.03, 0.5)):  # ε ∈ {0}, then ε ∈ {−1, 0, 1}
        kw = dict(learn_symmetry=False, eta_init=1.0, sampling="deterministic", num_transforms=num)
        weights, inputs = _mlp(transform_on="weights", **kw), _mlp(transform_on="inputs", **kw)
        with torch.no_grad():
            hw, hi = weights.features(x), inputs.features(x)
        rel = float((hw - hi).abs().max() / hw.abs().max())
        assert low <= rel < high, (num, rel)


@pytest.mark.parametrize("path", ["weights", "inputs"])
@pytest.mark.parametrize("activation", ["rff", "relu"])
def test_eta_gradients_flow_in_both_paths(path, activation):
    model = _mlp(symmetry="rotation+scale", eta_init=0.3, activation=activation, transform_on=path)
    x = _images(6).reshape(6, 64)
    torch.manual_seed(0)
    model.features(x).pow(2).sum().backward()
    grad = model.eta_unit_unconstrained.grad
    assert grad is not None and grad.shape == (3,) and torch.isfinite(grad).all() and (grad != 0).all()
    if activation == "relu":
        assert model.w1.grad is not None and model.w1.grad.abs().sum() > 0


def test_eta_gradients_of_the_two_paths_agree_on_smooth_images():
    """Same function up to interpolation ⇒ same η gradient up to the derivative of the interpolation
    error, which oscillates on the pixel scale and so shrinks only as O(h): at 32×32 (smooth W1 and
    x, rotation+scale) the paths' gradients differ by ≈2% of their norm (measured; 5% allowed; at
    16×16 the scale components differ by up to 20%, at 64×64 by 2%)."""
    grads = []
    for model in _path_pair(32, "rotation+scale", 0.5, learn_symmetry=True):
        model.features(_blobs(5, 32, seed=2)).pow(2).sum().backward()
        grads.append(model.eta_unit_unconstrained.grad)
    assert float((grads[0] - grads[1]).norm()) < 0.05 * float(grads[0].norm()), grads


def test_auto_warps_inputs_for_small_batches_and_weights_otherwise(monkeypatch):
    from pyro_invariance.models import invariant_mlp as module

    calls = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)

    spy("warp_stack", module.warp_stack)  # the inputs path's warp
    spy("transform_weight_rows", module.transform_weight_rows)  # the weights path's warp
    assert _mlp(hidden=8).transform_on == "weights"  # the default: the paper's model
    model = _mlp(hidden=8, transform_on="auto")
    for batch, expected in [(1, "inputs"), (7, "inputs"), (8, "weights"), (20, "weights")]:
        calls.clear()
        assert model.transform_path(batch) == expected
        h = model.features(_images(batch).reshape(batch, 64))
        assert h.shape == (batch, 8)
        assert calls == (["warp_stack"] if expected == "inputs" else ["transform_weight_rows"]), batch
    for fixed in ("weights", "inputs"):
        pinned = _mlp(hidden=8, transform_on=fixed)
        assert {pinned.transform_path(b) for b in (1, 8, 20)} == {fixed}
