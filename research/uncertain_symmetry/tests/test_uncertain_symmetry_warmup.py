"""The warm-up benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_warmup.py``) at the quick
size: a unit is warmed up (q(η) held) and fitted with the stated settings, its saved state reloads to the same
q(η), the amortisation profile runs on the reference's window, and the phases refuse to run out of order."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script

QUICK = Path(__file__).resolve().parents[1] / "results" / "uncertain_symmetry_quick.json"
UNIT = "rbf_upright_seed0"


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_warmup")


def _args(work: Path, phase: str) -> list[str]:
    return [
        "--from",
        str(QUICK),
        "--reference",
        str(work / "reference"),
        "--work-dir",
        str(work),
        f"--{phase}",
        "--only",
        UNIT,
    ]


def test_a_unit_is_warmed_up_fitted_saved_and_profiled(bench, tmp_path) -> None:
    with pytest.raises(SystemExit):  # out of order: nothing fitted yet
        bench.main(_args(tmp_path, "profile"))
    assert bench.main(_args(tmp_path, "fit")) == 0
    ev = json.loads((tmp_path / "evaluated" / f"{UNIT}.json").read_text())
    assert ev["meta"]["variant"] == "rbf" and ev["q_eta"]["sd"] > 0 and {"nll", "accuracy"} <= set(ev["metrics"])
    assert math.isfinite(ev["warmup_final_elbo_per_datum"]) and math.isfinite(ev["final_elbo_per_datum"])
    model, guide, x, y, meta = bench.load_state(tmp_path / "states" / f"{UNIT}.pt")
    assert guide.symmetry_dependence == "rbf" and meta["dataset"] == "upright"
    size = {k: json.loads(QUICK.read_text())["settings"][k] for k in bench.us.SIZES["default"]}
    data = bench.usi.load_dataset(bench.us.DATASETS["upright"][0], size)
    from types import SimpleNamespace

    draws = bench.us.q_draws(SimpleNamespace(model=model, guide=guide), data, size, 0)
    assert np.max(np.abs(draws.round(5) - np.asarray(ev["q_draws"]))) <= 1e-5  # the reloaded state is the fit
    with pytest.raises(SystemExit):  # the reference's window is missing
        bench.main(_args(tmp_path, "profile"))
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "upright_seed0.json").write_text(json.dumps({"window": [0, 6, 12, 36]}))
    assert bench.main(_args(tmp_path, "profile")) == 0
    prof = json.loads((tmp_path / "profile" / f"{UNIT}.json").read_text())
    assert prof["etas"] == pytest.approx([0.0, math.pi / 6, math.pi / 3, math.pi])
    assert all(math.isfinite(v) for v in prof["refined"]) and len(prof["refined_estimates"]) == 2
    with pytest.raises(SystemExit):  # the other units' references are missing
        bench.main(_args(tmp_path, "render"))


def test_settings_are_the_stated_ones(bench) -> None:
    assert bench.WARMUP_STEPS == 2000 and bench.SYMMETRY_INIT_SCALE == pytest.approx(math.pi / math.sqrt(3))
    assert bench.VARIANTS == {"rbf": "rbf", "linear": "linear", "no-warm-up": "linear"} and bench.CONTROLS == (
        "no-warm-up",
    )


def test_the_control_fits_once_and_the_refinement_continues_a_fit(bench, tmp_path) -> None:
    control = "no-warm-up_upright_seed0"
    assert bench.main([*_args(tmp_path, "fit")[:-1], control]) == 0
    ev = json.loads((tmp_path / "evaluated" / f"{control}.json").read_text())
    assert ev["warmup_seconds"] == 0.0 and math.isnan(ev["warmup_final_elbo_per_datum"])
    with pytest.raises(SystemExit):  # nothing fitted for this unit yet
        bench.main(_args(tmp_path, "refine"))
    assert bench.main(_args(tmp_path, "fit")) == 0
    assert bench.main(_args(tmp_path, "refine")) == 0
    refined = json.loads((tmp_path / "evaluated" / f"{UNIT}_refined.json").read_text())
    size = {k: json.loads(QUICK.read_text())["settings"][k] for k in bench.us.SIZES["default"]}
    assert refined["refine"] == bench.usi.refine_config(size) and math.isfinite(refined["refine_final_bound_per_datum"])
    fitted = json.loads((tmp_path / "evaluated" / f"{UNIT}.json").read_text())
    assert refined["q_eta"]["mean"] != pytest.approx(fitted["q_eta"]["mean"], abs=1e-6)  # q(η) was trained
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "upright_seed0.json").write_text(json.dumps({"window": [3, 6, 9]}))
    assert bench.main(_args(tmp_path, "profile")) == 0  # the fit's profile and its refinement's
    profiles = [json.loads((tmp_path / "profile" / f"{UNIT}{sfx}.json").read_text()) for sfx in ("", "_refined")]
    assert all(len(p["refined"]) == 3 for p in profiles) and profiles[0]["refined"] != profiles[1]["refined"]
