"""``compile="auto"`` (the default): the captured graph where the model declares it safe and the call is
long enough, eager Pyro otherwise, and in either case the numbers of ``compile="off"``, bit for bit."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule

import pyro_invariance as pi
from pyro_invariance.catalogue import model_kwargs_for
from pyro_invariance.data import load_dataset
from pyro_invariance.infer import auto_compile, training
from pyro_invariance.infer.prior_update import ClosedFormPriorUpdate

#: (model, its keywords, dataset, its keywords, guide, extra fit keywords)
FAMILIES = {
    "invariant-mlp": ("invariant-mlp", dict(hidden=16, num_transforms=4), "rotated-digits", dict(train_size=96)),
    "rotation-toy-2d": ("rotation-toy-2d", {}, "rotation-toy-2d", {}),
    "basis-regression": ("basis-regression", {}, "basis-toy", {}),
    "symmetrised-hnn": ("symmetrised-hnn", dict(hidden=(16,), prior="closed-form"), "sho", {}),
    "layerwise": ("layerwise-fc+conv", dict(alpha=1), "digits-16px", dict(train_size=96)),
}
GUIDES = {"symmetrised-hnn": "matrix-normal", "layerwise": "map", "rotation-toy-2d": "full-rank"}


def _build(family, **extra):
    model_name, mkw, data_name, dkw = FAMILIES[family]
    mkw = {**mkw, **extra}
    data = load_dataset(data_name, **dkw)
    model = pi.models.get(model_name, **model_kwargs_for(model_name, data, **mkw))
    return model, pi.guides.get(GUIDES.get(family, "block-cholesky"), model), data


def _fit(family, compile, **kw):
    model, guide, data = _build(family)
    callbacks = [ClosedFormPriorUpdate(warmup=2)] if family == "symmetrised-hnn" else []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" decides silently
        return pi.fit(model, guide, data, steps=8, batch_size=32, seed=1, progress=False, compile=compile,
                      callbacks=callbacks, **kw)  # fmt: skip


def _same(a, b):
    assert a.history["elbo"] == b.history["elbo"]
    assert a.history["eta"] == b.history["eta"]
    for (name, p), (_, q) in zip(a.guide.state_dict().items(), b.guide.state_dict().items()):
        assert torch.equal(p, q), name
    for (name, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_replays_the_captured_graph_with_the_eager_numbers(family, monkeypatch):
    monkeypatch.setattr(auto_compile, "AUTO_CAPTURE_STEPS", 4)
    auto, off = _fit(family, "auto"), _fit(family, "off")
    assert auto.step_stats["compile"] == "capture" and auto.step_stats["bit_identical"], auto.step_stats
    assert off.step_stats["compile"] == "off"
    _same(auto, off)


def test_auto_keeps_the_eager_numbers_under_fit_laplace(monkeypatch):
    """The Laplace evidence update changes the prior precisions between steps (tensors the graph reads)."""
    monkeypatch.setattr(auto_compile, "AUTO_CAPTURE_STEPS", 4)
    runs = {}
    for mode in ("auto", "off"):
        model, _, data = _build("layerwise", prior="fixed")
        runs[mode] = pi.fit_laplace(
            model, "map", data, steps=10, batch_size=32, seed=2, progress=False, warmup=3, every=3, compile=mode
        )
    assert runs["auto"].step_stats["compile"] == "capture"
    _same(runs["auto"], runs["off"])
    assert runs["auto"].log_evidence == runs["off"].log_evidence


def test_a_short_call_runs_eagerly_and_says_why():
    result = _fit("invariant-mlp", "auto")
    assert result.step_stats["compile"] == "off"
    assert f"fewer than {auto_compile.AUTO_CAPTURE_STEPS}" in result.step_stats["auto"]


class OwnModel(PyroModule):
    """A user's Bayesian linear regression, ``model(x, y=None)``."""

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)


class DeclaredModel(OwnModel):
    capturable = True


@pytest.mark.parametrize(("cls", "mode"), [(OwnModel, "off"), (DeclaredModel, "capture")])
def test_a_users_own_model_runs_eagerly_unless_it_declares_itself_capturable(cls, mode, monkeypatch):
    monkeypatch.setattr(auto_compile, "AUTO_CAPTURE_STEPS", 2)
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    runs = {}
    for compile in ("auto", "off"):
        model = cls()
        guide = pyro.infer.autoguide.AutoNormal(model)
        runs[compile] = pi.fit(model, guide, (x, y), steps=6, batch_size=None, progress=False, compile=compile)
    assert runs["auto"].step_stats["compile"] == mode
    if mode == "off":
        assert runs["auto"].step_stats["auto"] == "the model does not declare itself capturable"
    assert runs["auto"].history["elbo"] == runs["off"].history["elbo"]


@pytest.mark.parametrize("settings", [dict(shards=2), dict(validation="always")])
def test_auto_is_accepted_where_capture_is_not_and_runs_eagerly(settings, monkeypatch):
    monkeypatch.setattr(auto_compile, "AUTO_CAPTURE_STEPS", 2)
    with pytest.raises(ValueError, match="compile='capture' needs"):
        pi.FitConfig(compile="capture", **settings).validate()
    result = _fit("basis-regression", "auto", **settings)
    assert result.step_stats["compile"] == "off" and "one shard" in result.step_stats["auto"]


def test_auto_is_the_default_and_not_part_of_the_fingerprint():
    assert pi.FitConfig().compile == "auto"
    for mode in ("auto", "off", "capture"):
        assert "compile" not in training.fingerprint_settings(pi.FitConfig(compile=mode))
