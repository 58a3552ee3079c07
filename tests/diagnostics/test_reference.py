"""Reference posteriors: stored NUTS draws pass their diagnostics, match the exact posterior where it is
known, and score guides (full-rank matches, mean-field is too narrow)."""

from __future__ import annotations

import json
import math
import shutil
import tomllib
from pathlib import Path

import torch

torch.set_num_threads(1)

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pytest  # noqa: E402
from pyro import poutine  # noqa: E402
from pyro.poutine.util import site_is_subsample  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.diagnostics import reference as ref_mod  # noqa: E402
from pyro_invariance.diagnostics.reference import (  # noqa: E402
    ESS_BULK_MIN,
    RHAT_MAX,
    NUTSSettings,
    ReferenceFileError,
    diagnose,
    load_reference,
    main,
    names,
    score_draws,
    score_guide,
    sliced_wasserstein2,
)
from pyro_invariance.registry import UnknownNameError  # noqa: E402

#: Full-rank guide vs the NUTS reference on basis-regression (fit below: 1000 steps, lr 0.05, init
#: scale 0.3, 1 particle, 1000 guide draws). Measured: mean error ≤ 0.05 sd, variance ratios 0.79–1.03
#: (geometric mean 0.86; 1500 steps: ≤ 0.08 sd, 0.82–1.03). The tolerances leave room for other seeds
#: and platforms: SVI with one particle ends a little narrow (variance ratios 0.5–1.0 over seeds 0–2 at
#: init scale 1).
FULL_RANK_MEAN_ERROR_MAX = 0.2
FULL_RANK_VAR_RATIO = (0.6, 1.5)
#: Mean-field: its variance is 1 / (posterior precision)_ii, 0.11–0.38 of the marginal variance here.
MEAN_FIELD_VAR_RATIO_MAX = 0.6


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


# ------------------------------------------------------------------------------------------------
# the stored references


@pytest.mark.parametrize("name", names())
def test_stored_reference_passes_diagnostics(name):
    ref = load_reference(name)
    meta = ref.metadata
    d = meta["diagnostics"]
    assert d["rhat_max"] < RHAT_MAX and d["ess_bulk_min"] > ESS_BULK_MIN and d["passes"]
    # recomputed from the stored float32 draws, not taken on trust
    again = diagnose(ref.draws)
    assert again["rhat_max"] < RHAT_MAX and again["ess_bulk_min"] > ESS_BULK_MIN
    assert again["rhat_max"] == pytest.approx(d["rhat_max"], rel=1e-6)
    assert again["ess_bulk_min"] == pytest.approx(d["ess_bulk_min"], rel=1e-6)
    assert ref.num_chains >= 4 and meta["sampler"]["num_chains"] == ref.num_chains
    assert meta["draws_per_chain"] == ref.num_draws == meta["sampler"]["num_samples"] // meta["sampler"]["thin"]
    for key in ("seed", "wall_seconds", "date", "versions", "command", "entry", "data", "divergences"):
        assert key in meta, key
    assert meta["divergences"] == 0
    assert meta["command"] == f"python -m pyro_invariance.diagnostics.reference regenerate --name {name}"
    assert (ref_mod.REFERENCE_DIR / f"{name}.npz").stat().st_size < 1.1e6  # compact


@pytest.mark.parametrize("name", names())
def test_stored_reference_matches_its_entry(name):
    """Same sites and shapes as the model's latent sites; the data regenerate to the same bytes."""
    ref = load_reference(name)
    model, x, y = ref.entry.build()
    tr = poutine.trace(model).get_trace(x, y)
    latents = {
        k: tuple(s["value"].shape)
        for k, s in tr.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
    }
    assert latents == {k: tuple(v.shape[2:]) for k, v in ref.draws.items()}
    assert ref.metadata["data"]["fingerprint_sha256"] == ref_mod.data_fingerprint(x, y)
    # the stored record is the catalogue's current entry (change an entry -> regenerate its reference)
    assert ref.metadata["entry"] == json.loads(json.dumps(ref.entry.to_dict()))


def test_catalogue_metadata():
    assert names() == [
        "basis-regression",
        "rotation-toy-2d-full",
        "rotation-toy-2d-none",
        "invariant-mlp-digits",
        "basis-regression-lambda",
        "invariant-mlp-digits-eta",
    ]
    for e in ref_mod.ENTRIES.values():
        assert e.description and e.paper and e.symmetry
        assert e.model in pi.MODELS
        # η is either held fixed at stated values or latent (symmetry_prior): then nothing is fixed
        latent = e.model_kwargs.get("symmetry_prior") is not None
        assert bool(e.fixed) != latent, e.name


def test_stored_references_are_package_data():
    """A wheel ships the draws and metadata: pyproject lists the subpackage and its posteriors folder."""
    setuptools = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    package = "pyro_invariance.diagnostics.reference"
    assert package in setuptools["packages"]
    patterns = setuptools["package-data"][package]
    assert ref_mod.REFERENCE_DIR.parent.name == "reference"
    folder = ref_mod.REFERENCE_DIR.name
    for name in names():
        for ext in ("npz", "json"):
            assert f"{folder}/*.{ext}" in patterns and (ref_mod.REFERENCE_DIR / f"{name}.{ext}").is_file()


def _exact(ref):
    model, x, y = ref.entry.build()
    mean, cov = model.posterior(x, y)
    return mean[0].numpy(), cov.numpy()


def test_nuts_reference_matches_the_exact_posterior():
    """basis-regression has a Gaussian posterior in closed form: the reference reproduces it.

    Tolerances from the Monte-Carlo error: with bulk ESS ≥ 2000 per coordinate the standard error of
    a mean is ≤ 0.023 sd and of a variance ≤ 5% (ESS of the squares ≥ 800), so 0.1 sd and ±20% are ≥ 4 s.e.
    """
    ref = load_reference("basis-regression")
    mean, cov = _exact(ref)
    draws = ref.flat()
    sd = np.sqrt(np.diag(cov))
    assert ref.metadata["diagnostics"]["ess_bulk_min"] > 2000
    assert np.abs(draws.mean(0) - mean).max() / sd.min() < 0.1
    ratio = draws.var(0, ddof=1) / np.diag(cov)
    assert 0.8 < ratio.min() and ratio.max() < 1.2, ratio
    corr = np.corrcoef(draws.T)
    exact_corr = cov / np.outer(sd, sd)
    assert np.abs(corr - exact_corr).max() < 0.08
    assert np.abs(exact_corr - np.eye(len(sd))).max() > 0.8  # a strongly correlated posterior

    # the scores of exact draws sit at the Monte-Carlo floor
    exact = np.random.default_rng(0).multivariate_normal(mean, cov, size=2000)
    score = score_draws({"weight": exact[:, None, :]}, ref)
    assert score["mean_error_max"] < 0.1 and abs(score["log_var_ratio_mean"]) < 0.1
    assert score["sliced_w2"] < 2 * score["sliced_w2_floor"] + 0.02


def _fit(guide_name, steps, **guide_kwargs):
    ref = load_reference("basis-regression")
    model, x, y = ref.entry.build()
    guide = guides.get(guide_name, model, **guide_kwargs)
    pi.fit(model, guide, (x, y), steps=steps, batch_size=None, lr=0.05, factor_lr=0.05, seed=0, progress=False)
    return ref, model, guide


def test_full_rank_guide_matches_and_mean_field_is_too_narrow():
    """The criterion on basis-regression: full-rank matches mean and variance within the stated
    tolerances; mean-field underestimates every marginal variance, by the known amount
    var_q = 1 / Λ_ii ≤ Σ_ii (Λ the posterior precision)."""
    ref, model, full = _fit("full-rank", 1000, init_scale=0.3)
    s_full = score_guide(full, model, ref, num_samples=1000, num_projections=100)
    assert s_full["mean_error_max"] < FULL_RANK_MEAN_ERROR_MAX, s_full
    lo, hi = FULL_RANK_VAR_RATIO
    assert math.log(lo) < s_full["log_var_ratio_min"] and s_full["log_var_ratio_max"] < math.log(hi), s_full

    _, model_mf, mf = _fit("mean-field", 600, init_scale=0.3)
    s_mf = score_guide(mf, model_mf, ref, num_samples=1000, num_projections=100)
    assert s_mf["log_var_ratio_max"] < math.log(MEAN_FIELD_VAR_RATIO_MAX), s_mf
    assert s_mf["var_ratio_geomean"] < 0.5 * s_full["var_ratio_geomean"]
    assert s_mf["sliced_w2"] > s_full["sliced_w2"]
    assert s_mf["mean_error_max"] < 0.2  # the means are right; only the spread is wrong

    # the known property, coordinate by coordinate: q's variance is the inverse precision diagonal
    _, cov = _exact(ref)
    expected = 1.0 / np.diag(np.linalg.inv(cov))
    with torch.no_grad():
        got = mf.scales.weight.numpy()[0] ** 2
    np.testing.assert_allclose(got, expected, rtol=0.3)
    assert (expected / np.diag(cov) < 0.5).all()


# ------------------------------------------------------------------------------------------------
# scoring helpers


def test_sliced_wasserstein2():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4000, 5)), rng.standard_normal((4000, 5))
    assert sliced_wasserstein2(a, b) < 0.06
    shift = np.zeros(5)
    shift[0] = 1.0
    # E_u (u·c)² = |c|²/D for uniform directions u
    assert sliced_wasserstein2(a, b + shift, num_projections=500) == pytest.approx(1 / math.sqrt(5), rel=0.1)
    with pytest.raises(ValueError, match="same D"):
        sliced_wasserstein2(a, b[:, :3])


def test_score_draws_rejects_bad_draws():
    ref = load_reference("basis-regression")
    with pytest.raises(ValueError, match="lack"):
        score_draws({"other": np.zeros((10, 1, 8))}, ref)
    with pytest.raises(ValueError, match="shape"):
        score_draws({"weight": np.zeros((10, 8))}, ref)


# ------------------------------------------------------------------------------------------------
# bad input


def test_unknown_reference_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match="basis-regression"):
        load_reference("basis-regresion")
    with pytest.raises(UnknownNameError, match="Did you mean"):
        ref_mod.run_nuts("basis-regresion")
    with pytest.raises(SystemExit):
        main(["check", "--name", "nope"])


def _copy(tmp_path, name="basis-regression"):
    for ext in ("npz", "json"):
        shutil.copy(ref_mod.REFERENCE_DIR / f"{name}.{ext}", tmp_path / f"{name}.{ext}")
    return tmp_path / f"{name}.npz", tmp_path / f"{name}.json"


def test_missing_and_corrupt_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="regenerate"):
        load_reference("basis-regression", tmp_path)
    npz, meta = _copy(tmp_path)
    assert load_reference("basis-regression", tmp_path).draws["weight"].shape[0] >= 4

    npz.write_bytes(b"not a zip file")
    with pytest.raises(ReferenceFileError, match="cannot read"):
        load_reference("basis-regression", tmp_path)

    npz, meta = _copy(tmp_path)
    meta.write_text("{ not json")
    with pytest.raises(ReferenceFileError, match="not valid JSON"):
        load_reference("basis-regression", tmp_path)

    npz, meta = _copy(tmp_path)
    record = json.loads(meta.read_text())
    record["sites"]["weight"] = [1, 9]
    meta.write_text(json.dumps(record))
    with pytest.raises(ReferenceFileError, match="shape"):
        load_reference("basis-regression", tmp_path)

    npz, meta = _copy(tmp_path)
    with np.load(npz) as f:
        w = f["weight"].copy()
    w[0, 0, 0, 0] = np.nan
    np.savez_compressed(npz, weight=w)
    with pytest.raises(ReferenceFileError, match="non-finite"):
        load_reference("basis-regression", tmp_path)


def test_settings_and_entries_are_validated():
    with pytest.raises(ValueError, match="num_chains"):
        NUTSSettings(num_chains=0).validate()
    with pytest.raises(ValueError, match="target_accept_prob"):
        NUTSSettings(target_accept_prob=1.0).validate()
    with pytest.raises(ValueError, match="2 chains"):
        ref_mod.run_nuts("basis-regression", num_chains=1)
    import dataclasses

    learnable = dataclasses.replace(
        ref_mod.entry("basis-regression"),
        model_kwargs={**ref_mod.entry("basis-regression").model_kwargs, "learn_symmetry": True},
    )
    with pytest.raises(ValueError, match="learnable parameters"):
        learnable.build()
    wrong = dataclasses.replace(ref_mod.entry("basis-regression"), fixed={"lambda": 1.0})
    with pytest.raises(ValueError, match="fixed at 1.0"):
        wrong.build()


def test_quick_regenerate_needs_out():
    with pytest.raises(SystemExit):
        main(["regenerate", "--quick"])


# ------------------------------------------------------------------------------------------------
# the regenerate command


def test_regenerate_quick_writes_loadable_files(tmp_path, capsys):
    assert main(["regenerate", "--name", "basis-regression", "--quick", "--out", str(tmp_path)]) == 0
    ref = load_reference("basis-regression", tmp_path)
    assert ref.num_chains == 2 and ref.num_draws == 100
    assert ref.metadata["quick"] is True and ref.metadata["command"].endswith("--quick")
    assert (
        ref.metadata["data"]["fingerprint_sha256"]
        == load_reference("basis-regression").metadata["data"]["fingerprint_sha256"]
    )
    assert "wrote" in capsys.readouterr().out
    # `check` recomputes the diagnostics; quick draws fail the thresholds
    assert main(["check", "--dir", str(tmp_path), "--name", "basis-regression"]) in (0, 1)
    assert main(["list"]) == 0


def test_check_command_on_a_stored_reference(capsys):
    assert main(["check", "--name", "basis-regression"]) == 0
    out = capsys.readouterr().out
    assert "basis-regression" in out and "FAILS" not in out


@pytest.mark.slow
def test_regenerate_reproduces_the_stored_basis_regression_reference(tmp_path):
    """Same seed, same settings: the draws come out the same on this machine (JIT and all)."""
    assert main(["regenerate", "--name", "basis-regression", "--out", str(tmp_path)]) == 0
    new, old = load_reference("basis-regression", tmp_path), load_reference("basis-regression")
    np.testing.assert_allclose(new.draws["weight"], old.draws["weight"], atol=1e-4)
