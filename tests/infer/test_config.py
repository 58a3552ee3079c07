"""One training configuration: precedence (explicit > model > guide > library), shared by fit,
fit_laplace, compare_guides and the CLI (options generated from FitConfig)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.cli import build_parser
from pyro_invariance.diagnostics.evaluation import elbo_per_datum
from pyro_invariance.infer.config import FitConfig, config_overrides, config_parent
from pyro_invariance.infer.laplace import LaplaceFitResult, fit_laplace
from pyro_invariance.models.basis_regression import make_symmetric_toy
from pyro_invariance.models.layerwise import FIT_DEFAULTS, LayerwiseNet

torch.set_num_threads(1)


def _basis_model():
    # the reference configuration of tests/infer/test_evidence.py (correlated RBF features, exact log Z)
    return pi.models.get(
        "basis-regression",
        in_features=1,
        out_features=3,
        num_features=8,
        lengthscale=0.6,
        prior_scale=0.5,
        noise_scale=0.3,
    )


def test_precedence_explicit_then_model_then_guide_then_library():
    model = LayerwiseNet("conv", (1, 8, 8), 3, alpha=1)
    full_rank = guides.get("full-rank", _basis_model())
    assert FitConfig.recommended().factor_lr == FitConfig().factor_lr == 1e-3  # library
    assert FitConfig.recommended(guide=full_rank).factor_lr == 0.05  # guide over library
    both = FitConfig.recommended(model, full_rank)
    assert (both.lr, both.eta_lr, both.factor_lr) == (
        FIT_DEFAULTS["lr"],
        FIT_DEFAULTS["eta_lr"],
        0.05,
    )  # model over guide
    assert FitConfig.recommended(model, full_rank, lr=0.3).lr == 0.3  # explicit over all
    given = FitConfig(steps=7)
    assert pi.infer.config.resolve_config(given, model, full_rank, {"lr": 0.2}) == FitConfig(steps=7, lr=0.2)


def test_unknown_setting_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"unknown fit setting 'lrr'; FitConfig has steps, batch_size, batch_group, lr"):
        FitConfig.recommended(lrr=0.1)
    with pytest.raises(ValueError, match="lr must be a positive"):
        FitConfig.recommended(lr=-1.0)


def test_fit_uses_the_model_defaults_and_beats_chance_on_quadrant_digits():
    data = pi.load_dataset("quadrant-digits", train_size=600, test_size=300)
    model = pi.models.get("layerwise-conv", image_shape=list(data.image_shape), num_classes=data.num_classes, alpha=2)
    result = pi.fit(model, "map", data, steps=150, progress=False)
    assert result.config.lr == FIT_DEFAULTS["lr"] and result.config.eta_lr == FIT_DEFAULTS["eta_lr"]
    first = 0.5 * (1 + math.cos(math.pi / 150))  # the optimiser's rates after step 1 of the cosine schedule
    assert result.history["lr"][0] == pytest.approx(FIT_DEFAULTS["lr"] * first)
    accuracy = pi.evaluate(result, data, num_samples=1)["accuracy"]
    assert accuracy > 0.3, accuracy  # chance is 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_rank_reaches_the_exact_evidence_with_default_settings(seed):
    x, y = make_symmetric_toy(40, seed=3, noise=0.3, even=True, num_outputs=3)
    model = _basis_model()
    result = pi.fit(model, "full-rank", (x, y), steps=500, progress=False, seed=seed)
    assert (result.config.factor_lr, result.config.num_particles) == (0.05, 4)
    elbo = 40 * elbo_per_datum(model, result.guide, x, y, num_particles=1000, meanfield=False)
    with torch.no_grad():
        gap = float(model.log_evidence(x, y)) - elbo
    assert -0.1 < gap < 1.5, gap


def test_fit_laplace_takes_fits_arguments_and_returns_its_result_type():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(24, 1, 8, 8, generator=gen), torch.randint(0, 3, (24,), generator=gen)
    model = LayerwiseNet("fc+conv", (1, 8, 8), 3, alpha=1, prior="fixed")
    result = fit_laplace(
        model,
        "map",
        (x, y),
        FitConfig(steps=4, batch_size=8, lr=1e-2),
        every=2,
        warmup=2,
        ggn_batch_size=8,
        progress=False,
    )
    assert isinstance(result, LaplaceFitResult) and isinstance(result, pi.FitResult)
    assert result.config.steps == 4 and math.isfinite(result.log_evidence) and result.evidence_log


def test_cli_options_are_generated_from_the_config():
    parser = argparse.ArgumentParser(parents=[config_parent()])
    assert config_overrides(parser.parse_args([])) == {}  # nothing given: the model/guide defaults apply
    args = parser.parse_args(["--lr", "0.2", "--batch-size", "full", "--elbo", "trace"])
    assert config_overrides(args) == {"lr": 0.2, "batch_size": None, "elbo": "trace"}
    for command in ("fit", "compare"):
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        options = {a.dest for a in sub._actions}
        assert set(FitConfig.names()) <= options, command


def test_step_settings_are_checked_and_generated_for_the_cli():
    """The step-time settings: how a step runs (validation, compile, log_every, tf32)."""
    assert FitConfig(compile=True).compile == "inductor" and FitConfig(compile=False).compile == "off"
    assert FitConfig().replace(compile=True).compile == "inductor"
    for bad, message in (
        ({"validation": "never"}, "unknown validation 'never'"),
        ({"compile": "jit"}, "unknown compile 'jit'"),
        ({"log_every": 0}, "log_every must be an integer >= 1"),
        ({"tf32": "yes"}, "tf32 must be True or False"),
        ({"compile": "capture", "validation": "always"}, "needs validation='first-step'"),
    ):
        with pytest.raises(ValueError, match=message):
            FitConfig(**bad).validate()
    parser = argparse.ArgumentParser(parents=[config_parent()])
    args = parser.parse_args(["--compile", "capture", "--validation", "always", "--log-every", "5", "--tf32"])
    assert config_overrides(args) == {"compile": "capture", "validation": "always", "log_every": 5, "tf32": True}
    assert config_overrides(parser.parse_args(["--no-tf32"])) == {"tf32": False}
