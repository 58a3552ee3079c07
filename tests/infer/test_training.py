"""fit(): checkpoints and bit-for-bit resume, clear errors, minibatch scaling."""

import math

import pytest
import torch
from small_runs import fit_state, small_digits, small_fit, small_model

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.infer.checkpoint import CheckpointError
from pyro_invariance.infer.step_loop import param_groups
from pyro_invariance.infer.training import FitConfig

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return small_digits()


def _model(**kw):
    return small_model(**kw)


def _run(data, tmp_path, **kw):
    return small_fit(data, **kw)


_state = fit_state


def test_resume_reproduces_uninterrupted_run_bit_for_bit(data, tmp_path):
    full = _run(data, tmp_path, checkpoint_path=tmp_path / "full.pt")
    first = _run(data, tmp_path, checkpoint_path=tmp_path / "part.pt", checkpoint_every=5, until_step=7)
    assert first.history["step"][-1] == 7
    resumed = _run(data, tmp_path, checkpoint_path=tmp_path / "part.pt", resume=True)
    assert resumed.history["step"] == list(range(1, 13))
    assert resumed.history["elbo"] == full.history["elbo"]
    assert resumed.history["eta"] == full.history["eta"]
    a, b = _state(full), _state(resumed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_same_seed_same_run_different_seed_differs(data, tmp_path):
    a = _run(data, tmp_path, steps=5)
    b = _run(data, tmp_path, steps=5)
    assert a.history["elbo"] == b.history["elbo"]
    model = _model()
    c = pi.fit(model, guides.get("block-cholesky", model), data, steps=5, batch_size=64, progress=False, seed=6)
    assert c.history["elbo"] != a.history["elbo"]


def test_resume_with_other_settings_is_refused(data, tmp_path):
    _run(data, tmp_path, checkpoint_path=tmp_path / "c.pt", until_step=3)
    with pytest.raises(CheckpointError, match="another run: setting 'lr': saved 0.05, now 0.01"):
        _run(data, tmp_path, checkpoint_path=tmp_path / "c.pt", resume=True, lr=0.01)


def test_resume_into_another_model_is_refused(data, tmp_path):
    _run(data, tmp_path, checkpoint_path=tmp_path / "c.pt", until_step=3)
    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=24, num_transforms=4)
    with pytest.raises(CheckpointError, match="model setting 'hidden': saved 16, now 24"):
        pi.fit(
            model,
            guides.get("block-cholesky", model),
            data,
            steps=12,
            batch_size=64,
            progress=False,
            seed=5,
            checkpoint_path=tmp_path / "c.pt",
            resume=True,
        )


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04garbage"])
def test_corrupt_checkpoint_gives_clear_error(data, tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="corrupt|not a pyro_invariance"):
        _run(data, tmp_path, checkpoint_path=path, resume=True)


def test_truncated_checkpoint_gives_clear_error(data, tmp_path):
    _run(data, tmp_path, checkpoint_path=tmp_path / "t.pt", until_step=2)
    raw = (tmp_path / "t.pt").read_bytes()
    (tmp_path / "t.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError):
        _run(data, tmp_path, checkpoint_path=tmp_path / "t.pt", resume=True)


def test_missing_checkpoint(data, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        _run(data, tmp_path, checkpoint_path=tmp_path / "nope.pt", resume=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0},
        {"steps": -3},
        {"batch_size": 0},
        {"lr": -1.0},
        {"lr": float("nan")},
        {"eta_lr": 0.0},
        {"factor_lr": float("inf")},
        {"num_particles": 0},
        {"elbo": "nope"},
        {"schedule": "linear"},
        {"checkpoint_every": 5},  # without checkpoint_path
    ],
)
def test_invalid_hyperparameters(data, tmp_path, kwargs):
    with pytest.raises(ValueError):
        _run(data, tmp_path, **kwargs)


def test_nan_and_inf_data_rejected(data):
    x = data.x_train.clone()
    x[3, 0, 2, 2] = float("nan")
    model = _model()
    with pytest.raises(ValueError, match="non-finite"):
        pi.fit(model, "mean-field", (x, data.y_train), steps=2, progress=False)
    x[3, 0, 2, 2] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        pi.fit(model, "mean-field", (x, data.y_train), steps=2, progress=False)


def test_wrong_shapes_rejected(data):
    model = _model()
    with pytest.raises(ValueError, match="same number of rows"):
        pi.fit(model, "mean-field", (data.x_train, data.y_train[:-1]), steps=2, progress=False)
    with pytest.raises(ValueError, match="x must have shape"):
        pi.fit(model, "mean-field", (data.x_train[:, :, :4], data.y_train), steps=2, progress=False)
    with pytest.raises(ValueError, match="labels must lie"):
        pi.fit(model, "mean-field", (data.x_train, data.y_train + 10), steps=2, progress=False)


def test_non_finite_loss_names_step_and_site(data):
    model = _model()
    guide = guides.get("mean-field", model)
    pi.fit(model, guide, data, steps=1, progress=False)
    with torch.no_grad():
        guide.locs.out_bias_unconstrained.fill_(float("nan")) if hasattr(
            guide.locs, "out_bias_unconstrained"
        ) else next(p for n, p in guide.named_parameters() if "out_bias" in n).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"step 1: .*out_bias.* non-finite"):
        pi.fit(model, guide, data, steps=3, progress=False)


def test_unknown_guide_name(data):
    with pytest.raises(KeyError, match="unknown guide 'nope'"):
        pi.fit(_model(), "nope", data, steps=2, progress=False)


def test_cuda_request_without_gpu_is_clear(data, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same path on a machine with a GPU
    with pytest.raises(RuntimeError, match="cuda"):
        pi.fit(_model(), "mean-field", data, steps=2, progress=False, device="cuda")


def test_param_groups_split_eta_factors_and_guide(data):
    model = _model()
    guide = guides.get("block-cholesky", model)
    pi.fit(model, guide, data, steps=1, progress=False)
    groups = {g["name"]: g for g in param_groups(model, guide, FitConfig())}
    assert set(groups) == {"guide", "factors", "eta"}
    assert groups["eta"]["params"][0] is model.eta_unit_unconstrained
    assert groups["eta"]["lr"] == FitConfig().eta_lr
    n_all = sum(len(g["params"]) for g in groups.values())
    assert n_all == len(list(model.parameters())) + len(list(guide.parameters()))


def test_minibatch_elbo_is_unbiased_for_full_batch(data):
    """E over minibatches of the scaled likelihood equals the full-data likelihood (plate scaling)."""
    from pyro import poutine

    model = _model(learn_symmetry=False, eta_init=0.0, symmetry="none")
    guide = guides.get("map", model)
    x, y = data.x_train, data.y_train
    n = x.shape[0]
    guide(x, y, num_data=n)
    tr = poutine.trace(guide).get_trace(x, y, num_data=n)
    full = poutine.trace(poutine.replay(model, tr)).get_trace(x, y, num_data=n)
    full.compute_log_prob()
    parts = []
    for i in range(0, n, 64):
        t = poutine.trace(poutine.replay(model, tr)).get_trace(x[i : i + 64], y[i : i + 64], num_data=n)
        t.compute_log_prob()
        parts.append(float(t.nodes["obs"]["log_prob_sum"].detach()))  # already scaled by N/B
    assert math.isclose(sum(parts) / len(parts), float(full.nodes["obs"]["log_prob_sum"].detach()), rel_tol=1e-4)


def test_fit_result_json(data, tmp_path):
    result = _run(data, tmp_path, steps=3)
    result.save_json(tmp_path / "r.json")
    import json

    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["config"]["steps"] == 3 and len(payload["history"]["elbo"]) == 3
    assert set(payload["eta"]) == {"rot"}
