"""Inputs are converted and checked once, at the API boundary (fit, evaluate, the metrics, datasets)."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO
from small_runs import small_digits, small_model

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.arrays import test_arrays as held_out_arrays
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.data.images import load_dataset
from pyro_invariance.diagnostics.evaluation import regression_metrics
from pyro_invariance.diagnostics.hnn_metrics import evaluate_hnn
from pyro_invariance.models.basis_regression import make_symmetric_toy
from pyro_invariance.registry import DATASETS

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return small_digits()


_model = small_model


def _fit(data, steps=4, **kw):
    model = _model()
    guide = guides.get("mean-field", model)
    return pi.fit(model, guide, data, steps=steps, batch_size=64, progress=False, seed=3, **kw)


@pytest.fixture(scope="module")
def fitted(data):
    return _fit(data)


# ------------------------------------------------------------------------------------------ dtypes


def test_numpy_float64_x_and_any_label_dtype_train_bit_for_bit(data, fitted):
    x64 = data.x_train.numpy().astype(np.float64)
    for y in (data.y_train.numpy(), data.y_train.numpy().astype(np.float64), data.y_train.numpy().astype(np.uint8)):
        result = _fit((x64, y))
        assert result.history["elbo"] == fitted.history["elbo"], y.dtype
        assert result.history["eta"] == fitted.history["eta"], y.dtype


def test_coercion_gives_the_models_dtype_and_int64_labels(data):
    x, y = train_arrays((data.x_train.numpy().astype(np.float64), data.y_train.numpy().astype(np.float64)), _model())
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, data.x_train) and torch.equal(y, data.y_train)
    x, y = train_arrays((data.x_train.tolist(), data.y_train.tolist()), _model().double())  # lists; a float64 model
    assert x.dtype == torch.float64 and y.dtype == torch.int64
    raw_x, raw_y = train_arrays((data.x_train.numpy().astype(np.float64), data.y_train))  # no model: as given
    assert raw_x.dtype == torch.float64


def test_integer_x_is_converted_as_is_unless_the_dataset_gives_input_scale(data):
    pixels = torch.randint(0, 256, (256, 1, 8, 8), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    x, _ = train_arrays((pixels.numpy(), data.y_train), _model())
    assert x.dtype == torch.float32 and torch.equal(x, pixels.float())  # no scaling
    scaled = types.SimpleNamespace(x_train=pixels, y_train=data.y_train, input_scale=1 / 255)
    x, _ = train_arrays(scaled, _model())
    assert torch.equal(x, pixels.float() * (1 / 255))
    floats = types.SimpleNamespace(x_train=pixels.float() / 2, y_train=data.y_train, input_scale=1 / 255)
    assert torch.equal(train_arrays(floats, _model())[0], pixels.float() / 2)  # float x is never rescaled
    reference = _fit((pixels.float() * (1 / 255), data.y_train), steps=2)
    assert _fit(scaled, steps=2).history["elbo"] == reference.history["elbo"]
    with pytest.raises(ValueError, match="input_scale"):
        train_arrays(types.SimpleNamespace(x_train=pixels, y_train=data.y_train, input_scale=0.0), _model())


@pytest.mark.parametrize(
    "x, match",
    [
        (lambda d: d.x_train.to(torch.complex64), "x must hold real numbers"),
        (lambda d: d.x_train > 0.5, "x must hold real numbers"),
        (lambda d: np.array([object()] * 256, dtype=object), "x must be a numeric array"),
        (lambda d: d.x_train[:, :, :4], r"x must have shape \(B, 1, 8, 8\) or \(B, 64\), got \(256, 1, 4, 8\)"),
    ],
)
def test_bad_x_refused_naming_x(data, x, match):
    with pytest.raises(ValueError, match=match):
        train_arrays((x(data), data.y_train), _model())


def test_non_integral_float_labels_refused(data):
    y = data.y_train.double()
    y[17] = 2.5
    with pytest.raises(ValueError, match=r"y must hold integer class labels, got the value 2.5 in row 17"):
        train_arrays((data.x_train, y), _model())
    y[17] = float("nan")
    with pytest.raises(ValueError, match="y must hold integer class labels"):
        train_arrays((data.x_train, y), _model())
    with pytest.raises(ValueError, match=r"y must have shape \(B\)"):
        train_arrays((data.x_train, data.y_train[:, None]), _model())


# ------------------------------------------------------------------------------------------ labels


def test_out_of_range_label_in_any_row_refused_before_any_compute(data, monkeypatch):
    y = data.y_train.clone()
    y[255] = 12  # the last row: a short run with small batches would likely never draw it
    model = _model()
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: calls.append(1))
    msg = r"y has labels in \[0, 12\] \(first bad row 255\), but labels must lie in \[0, 10\) for the model's 10 "
    with pytest.raises(ValueError, match=msg):
        pi.fit(model, guides.get("mean-field", model), (data.x_train, y), steps=1, batch_size=8, progress=False)
    assert calls == []  # neither the guide set-up nor step 1 ran the model
    y[255] = -1
    with pytest.raises(ValueError, match=r"first bad row 255"):
        train_arrays((data.x_train, y), _model())


def test_forward_reads_no_label_values_but_pyro_validation_still_refuses_them(data):
    model = _model()
    guide = guides.get("mean-field", model)
    x, bad = data.x_train[:4], torch.tensor([0, 1, 2, 10])
    model(x, bad)  # no host sync in forward: values are not read there
    with pytest.raises(ValueError, match="support"):
        Trace_ELBO().loss(model, guide, x, bad)  # a user's own SVI loop: Pyro's validation


@contextlib.contextmanager
def _no_tensor_reads():
    """Fail on every way Python reads a tensor's value (each is a host sync on a GPU)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(n):
        def method(self, *args, **kwargs):
            raise AssertionError(f"forward read a tensor value (Tensor.{n}, shape {tuple(self.shape)})")

        return method

    try:
        for n in names:
            setattr(torch.Tensor, n, refuse(n))
        yield
    finally:
        for n, method in saved.items():
            setattr(torch.Tensor, n, method)


@pytest.mark.parametrize(
    "name, kwargs, x, y",
    [
        ("invariant-mlp", dict(image_shape=(1, 8, 8), hidden=8, num_transforms=2), (4, 1, 8, 8), torch.arange(4)),
        ("layerwise-fc+conv", dict(image_shape=(1, 8, 8), alpha=1), (4, 1, 8, 8), torch.arange(4)),
        ("rotation-toy-2d", {}, (4, 2), torch.tensor([0, 1, 0, 1])),
        ("symmetrised-hnn", dict(state_dim=2, hidden=(8,), num_transforms=2, euler_steps=1), (4, 2), torch.rand(4, 2)),
        ("basis-regression", dict(num_features=8), (4, 1), torch.rand(4, 1)),
    ],
)
def test_forward_reads_no_tensor_values(name, kwargs, x, y):
    """The per-step checks in ``forward`` look at shapes and dtypes only (no host sync per CUDA step)."""
    model = pi.models.get(name, **kwargs)
    x = torch.rand(*x)
    with pyro.validation_enabled(False), _no_tensor_reads():  # Pyro's own validation reads values
        model(x, y, num_data=10)


# ------------------------------------------------------------------------------------------ evaluate


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"num_samples": 0}, {"num_particles": 0}, {"seed": 1.5}])
def test_evaluate_refuses_bad_arguments_naming_them(fitted, data, kwargs):
    ((name, value),) = kwargs.items()
    with pytest.raises(ValueError, match=rf"{name} must be an integer.*got {value!r}"):
        pi.evaluate(fitted, data, **kwargs)


def test_evaluate_refuses_bad_labels(fitted, data):
    bad = types.SimpleNamespace(x_train=data.x_train, y_train=data.y_train, x_test=data.x_test, y_test=data.y_test + 10)
    with pytest.raises(ValueError, match=r"y has labels in \[10, 19\]"):
        pi.evaluate(fitted, bad, num_samples=2, num_particles=1)


def test_evaluate_is_seeded_and_leaves_the_callers_rng_alone(fitted, data):
    state = torch.get_rng_state()
    a = pi.evaluate(fitted, data, num_samples=3, num_particles=2)
    b = pi.evaluate(fitted, data, num_samples=3, num_particles=2)
    assert a == b
    assert torch.equal(torch.get_rng_state(), state)
    assert pi.evaluate(fitted, data, num_samples=3, num_particles=2, seed=1) != a
    numpy_data = (data.x_test.numpy().astype(np.float64), data.y_test.numpy().astype(np.float64))
    tensor_data = (data.x_test, data.y_test)
    assert pi.evaluate(fitted, numpy_data, num_samples=2, num_particles=1) == pi.evaluate(
        fitted, tensor_data, num_samples=2, num_particles=1
    )


def test_evaluation_metrics_are_seeded(fitted, data):
    state = torch.get_rng_state()
    a = pi.evaluate((fitted.model, fitted.guide), data, num_samples=2)
    assert a == pi.evaluate((fitted.model, fitted.guide), data, num_samples=2, seed=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_regression_metrics_seeded_and_coerced():
    model = pi.models.get("basis-regression", out_features=2, num_features=8)
    guide = guides.get("mean-field", model)
    x, y = make_symmetric_toy(30, seed=1, num_outputs=2)
    pi.fit(model, guide, (x.double().numpy(), y.double().numpy()), steps=3, batch_size=None, progress=False)
    state = torch.get_rng_state()
    a = regression_metrics(model, guide, (x.double().numpy(), y.double().numpy()), num_samples=3)
    assert a == regression_metrics(model, guide, (x, y), num_samples=3)
    assert a == pi.evaluate((model, guide), (x, y), num_samples=3)
    assert torch.equal(torch.get_rng_state(), state)
    xs, ys = held_out_arrays((x.double(), torch.ones(30, 2, dtype=torch.int64)), model)
    assert xs.dtype == ys.dtype == torch.float32
    with pytest.raises(ValueError, match=r"y must have shape \(B, 2\), got \(30, 3\)"):
        held_out_arrays((x, torch.zeros(30, 3)), model)


def test_hnn_inputs_and_evaluate_hnn_seeded():
    phys = load_dataset("sho", cache_dir=False, train_trajectories=3, train_steps=2, test_trajectories=2, test_steps=2)
    model = pi.models.get("symmetrised-hnn", state_dim=2, hidden=(8,), num_transforms=2, euler_steps=1)
    x, y = train_arrays((phys.x_train.double().numpy(), phys.y_train.double().numpy()), model)
    assert x.dtype == y.dtype == torch.float32 and torch.equal(x, phys.x_train)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 2\), got \(6, 3\)"):
        train_arrays((torch.zeros(6, 3), phys.y_train), model)
    guide = guides.get("mean-field", model)
    pi.fit(model, guide, phys, steps=2, batch_size=None, progress=False)
    state = torch.get_rng_state()
    a = evaluate_hnn(model, guide, phys, num_samples=2, num_particles=1, rollout_steps=1)
    assert a == evaluate_hnn(model, guide, phys, num_samples=2, num_particles=1, rollout_steps=1)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="num_particles must be an integer >= 1, got 0"):
        evaluate_hnn(model, guide, phys, num_particles=0)


# ------------------------------------------------------------------------------------------ datasets


PHYSICS = ("sho", "oscillators", "oscillators-3", "nbody", "nbody-3", "kepler")
SMALL_PHYSICS = {"cache_dir": False, "train_trajectories": 2, "train_steps": 2, "test_trajectories": 2, "test_steps": 2}


@pytest.mark.parametrize(
    "name",
    [
        "digits",
        "rotated-digits",
        "rotated-digits-16px",
        "quadrant-digits",
        "quadrant-digits-40",
        "fashion-mnist",
        "rotated-mnist",
        "scaled-cifar10",
        "rotation-toy-2d",
        *PHYSICS,
    ],
)
def test_train_size_zero_refused_for_every_kind_of_dataset(name):
    with pytest.raises(ValueError, match=r"train_size must be .*got 0"):
        load_dataset(name, train_size=0)  # before any file is read or any trajectory integrated


@pytest.mark.parametrize("name", ["digits", "fashion-mnist", "quadrant-digits", "mnist", "rotation-toy-2d", *PHYSICS])
def test_data_dir_that_is_a_file_refused(name, tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="data_dir"):
        load_dataset(name, data_dir=path)
    with pytest.raises(ValueError, match="data_dir"):
        DATASETS.get(name, data_dir=str(path))


@pytest.mark.parametrize("name", PHYSICS)
def test_physics_datasets_load_with_the_common_keywords(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_INVARIANCE_CACHE", str(tmp_path))
    d = load_dataset(name, data_dir=None, **SMALL_PHYSICS)
    assert d.x_train.shape[0] == 4
    d = DATASETS.get(name, data_dir=None, root=None, download=False, train_size=3, test_size=2, **SMALL_PHYSICS)
    assert d.x_train.shape[0] == 3 and d.x_test.shape[0] == 2 and d.x_moved.shape[0] == 2
    with pytest.raises(ValueError, match=r"train_size=5 exceeds the 4 examples available"):
        load_dataset(name, train_size=5, **SMALL_PHYSICS)


def test_load_dataset_sho_with_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_INVARIANCE_CACHE", str(tmp_path))
    d = load_dataset("sho", data_dir=None)  # what `pyro-invariance evaluate --data sho` calls
    assert d.x_train.shape == (28, 2)
    toy = load_dataset("rotation-toy-2d", data_dir=None)
    assert toy.x_train.shape == (40, 2)
