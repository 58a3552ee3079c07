"""The 2-D rotation toy (paper 003, Fig. 1): data, the invariant model, fitting, the extrapolation plot."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402
from pyro.poutine.util import site_is_subsample  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402,F401  (registers the guides fit() takes by name)
from pyro_invariance.catalogue import model_kwargs_for  # noqa: E402
from pyro_invariance.data.toy2d import (  # noqa: E402
    in_sector,
    make_rotation_toy,
    plane_grid,
    plot_extrapolation,
)
from pyro_invariance.models.toy2d import RotationToy2D, rotation_grid  # noqa: E402
from pyro_invariance.registry import DATASETS, MODELS  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def rotate(x: torch.Tensor, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return x @ torch.tensor([[c, -s], [s, c]], dtype=x.dtype).T


# ------------------------------------------------------------------------------------------------
# data


def test_data_shapes_labels_and_seeds():
    data = DATASETS.get("rotation-toy-2d")
    assert data.x_train.shape == (40, 2) and data.x_test.shape == (400, 2)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.num_classes == 2 and int(data.y_train.sum()) == 20 and int(data.y_test.sum()) == 200
    # the label is the ring: radius separates the classes
    r_train, r_test = data.x_train.norm(dim=-1), data.x_test.norm(dim=-1)
    assert ((r_train > 1.5) == data.y_train.bool()).all() and ((r_test > 1.5) == data.y_test.bool()).all()
    # training points on the 90° sector, test points all around the circle
    assert in_sector(data.x_train, data.info["sector"]).all()
    outside = ~in_sector(data.x_test, data.info["sector"])
    assert 0.65 < outside.float().mean() < 0.85
    # deterministic, and the splits use different seeds
    again = make_rotation_toy()
    assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)
    assert data.info["train_seed"] != data.info["test_seed"]
    other = make_rotation_toy(seed=1, train_size=10, sector=math.pi, center=1.0)
    assert other.x_train.shape == (10, 2) and not torch.equal(other.x_test, data.x_test)
    assert in_sector(other.x_train, math.pi, center=1.0).all()
    assert "rotation-toy-2d" in repr(data)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"train_size": 1}, "train_size"),
        ({"sector": 0.0}, "sector"),
        ({"sector": 7.0}, "sector"),
        ({"radii": (1.0, 1.0)}, "radii"),
        ({"radial_noise": -0.1}, "radial_noise"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_data_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_rotation_toy(**kwargs)


# ------------------------------------------------------------------------------------------------
# model


def test_registry_and_kwargs_from_dataset():
    data = DATASETS.get("rotation-toy-2d", train_size=6, test_size=4)
    kwargs = model_kwargs_for("rotation-toy-2d", data)
    assert kwargs == {"num_classes": 2}
    model = MODELS.get("rotation-toy-2d", **kwargs)
    assert isinstance(model, RotationToy2D)
    assert set(model.symmetry_summary()) == {"rot"}
    tr = poutine.trace(model).get_trace(data.x_train, data.y_train)
    latents = {
        n: s["value"].shape
        for n, s in tr.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
    }
    assert latents == {"out_weight": (1, 32), "out_bias": (1,)}
    assert tr.nodes["obs"]["is_observed"] and site_is_subsample(tr.nodes["data"])
    assert list(model.arviz_dims()["out_weight"]) == ["logit", "hidden"]


def test_rotation_grid_is_symmetric_midpoints():
    eps = rotation_grid(8)
    assert torch.allclose(eps, -eps.flip(0)) and eps.min() > -1 and eps.max() < 1
    assert torch.allclose(eps[1:] - eps[:-1], torch.full((7,), 0.25))


def test_full_invariance_predictions_are_rotation_invariant():
    torch.manual_seed(0)
    angle, radius = 2 * math.pi * torch.rand(50), 3.0 * torch.rand(50).sqrt()  # uniform on the plotted disk
    x = torch.stack([radius * angle.cos(), radius * angle.sin()], -1)
    full = RotationToy2D(learn_symmetry=False, eta_init=math.pi)
    none = RotationToy2D(learn_symmetry=False, eta_init=0.0)
    weight, bias = torch.randn(1, 32), torch.randn(1)
    with torch.no_grad():
        for model, invariant in ((full, True), (none, False)):
            base = model.logits_from(model.features(x), weight, bias)
            # exactly invariant on the grid's own angles, and to quadrature precision for any angle
            for angle in (2 * math.pi / 32 * 5, 0.3, 2.0, -1.1):
                rotated = model.logits_from(model.features(rotate(x, angle)), weight, bias)
                err = float((rotated - base).abs().max())
                if invariant:
                    assert err < 1e-4, (angle, err)
                else:
                    assert err > 0.1, (angle, err)


def test_some_invariance_is_partial_and_eta_is_learnable():
    x = torch.tensor([[1.5, 0.0]])
    some = RotationToy2D(learn_symmetry=False, eta_init=math.pi / 2)
    h = some.features(x)
    assert not torch.allclose(h, some.features(rotate(x, 0.5)), atol=1e-4)
    model = RotationToy2D(eta_init=0.5)
    assert [n for n, _ in model.named_parameters()] == ["eta_unit_unconstrained"]
    tr = poutine.trace(model).get_trace(x, torch.tensor([1]))
    tr.log_prob_sum().backward()
    assert model.eta_unit_unconstrained.grad is not None and model.eta_unit_unconstrained.grad.abs() > 0
    assert float(model.eta.detach()) == pytest.approx(0.5, rel=1e-5)


def test_stochastic_sampling_and_more_classes():
    model = RotationToy2D(num_classes=3, sampling="stochastic", learn_symmetry=False, eta_init=1.0, num_transforms=4)
    x = torch.randn(5, 2)
    logits = model(x, torch.tensor([0, 1, 2, 0, 1]))
    assert logits.shape == (5, 3) and torch.all(logits[:, 0] == 0)
    torch.manual_seed(0)
    a = model.features(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, model.features(x))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 1}, "num_classes"),
        ({"sampling": "grid"}, "sampling"),
        ({"lengthscale": 0.0}, "lengthscale"),
        ({"eta_init": 4.0}, "eta_init"),
        ({"eta_init": 0.0}, "eta_init"),  # learned η cannot start at 0
    ],
)
def test_bad_model_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotationToy2D(**kwargs)


def test_bad_model_inputs():
    model = RotationToy2D(learn_symmetry=False, eta_init=1.0)
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(3, 3))
    # values are checked once at the data boundary (prepare_inputs, called by fit / evaluate)
    with pytest.raises(ValueError, match="non-finite"):
        model.prepare_inputs(torch.tensor([[float("nan"), 0.0]]), None)
    with pytest.raises(ValueError, match="labels"):
        model.prepare_inputs(torch.zeros(2, 2), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="num_data"):
        model(torch.zeros(2, 2), torch.tensor([0, 1]), num_data=1)


# ------------------------------------------------------------------------------------------------
# fitting and plotting


@pytest.mark.parametrize("guide", ["mean-field", "full-rank", "matrix-normal", "block-cholesky", "low-rank", "map"])
def test_fit_runs_with_every_guide(guide):
    data = make_rotation_toy(train_size=16, test_size=8)
    model = pi.models.get("rotation-toy-2d", hidden=8, num_transforms=8)
    result = pi.fit(model, guide, data, steps=20, batch_size=8, progress=False)
    assert len(result.history["elbo"]) == 20 and math.isfinite(result.final_elbo)
    assert 0.0 <= result.eta["rot"] <= math.pi
    metrics = pi.evaluate(result, data, num_samples=2, num_particles=2)
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_fit_decreases_loss_and_full_invariance_extrapolates():
    data = make_rotation_toy()
    results = {}
    for label, eta in (("η = 0", 0.0), ("η = π", math.pi)):
        model = pi.models.get("rotation-toy-2d", learn_symmetry=False, eta_init=eta, hidden=16)
        results[label] = pi.fit(model, "mean-field", data, steps=150, batch_size=None, lr=0.05, progress=False)
        elbo = results[label].history["elbo"]
        assert sum(elbo[-20:]) / 20 > sum(elbo[:20]) / 20 + 0.25  # ELBO/N rises: the loss decreases
    outside = ~in_sector(data.x_test, data.info["sector"])
    acc = {}
    for label, result in results.items():
        probs = pi.data.toy2d.predictive_probabilities(result.model, result.guide, data.x_test[outside], num_samples=16)
        acc[label] = float((probs.argmax(-1) == data.y_test[outside]).float().mean())
    assert acc["η = π"] > 0.95 and acc["η = 0"] < 0.85, acc

    fig = plot_extrapolation(results, data=data, grid_size=21)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["η = 0", "η = π"] and len(fig.axes) == 3  # + colour bar
    plt.close(fig)


def test_plot_accepts_arrays_and_callables_and_rejects_bad_shapes():
    _, _, points = plane_grid(3.0, 11)
    radial = (points.norm(dim=-1) > 1.5).float()
    fig = plot_extrapolation(
        {"array": radial.numpy(), "callable": lambda p: torch.stack([1 - radial, radial], -1)},
        data=make_rotation_toy(train_size=6, test_size=4),
        grid_size=11,
    )
    assert [ax.get_title() for ax in fig.axes[:2]] == ["array", "callable"]
    plt.close(fig)
    with pytest.raises(ValueError, match="one value per grid point"):
        plot_extrapolation({"bad": torch.zeros(5)}, grid_size=11)
    with pytest.raises(ValueError, match="empty"):
        plot_extrapolation({})
