"""The IWAE-given-η refinement benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_iwae.py``):
the saved start reproduces the input's q(η) and reloads to the same q(η), the refinement runs with the
pre-registered settings and K = the input's ``iwae_K``, the amortisation profile is finite on the boundary
too, and the phases refuse to run out of order; at the quick size."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script

QUICK = Path(__file__).resolve().parents[1] / "results" / "uncertain_symmetry_quick.json"
UNIT = "mean-field_upright_seed0"


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_iwae")


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


def test_start_reproduces_and_reloads_the_input_fit_then_the_refinement_runs(bench, tmp_path) -> None:
    payload = json.loads(QUICK.read_text())
    size = {k: payload["settings"][k] for k in bench.us.SIZES["default"]}
    unit = next(u for u in payload["units"] if u["dataset"] == "upright" and u["seed"] == 0)
    with pytest.raises(SystemExit):  # out of order: nothing prepared yet
        bench.main(_args(tmp_path, "refine"))
    assert bench.main(_args(tmp_path, "prepare")) == 0
    start = tmp_path / "prepared" / f"{UNIT}.pt"
    model, guide, x, y, meta = bench.load_state(start)
    assert meta["reproduction_max_abs_diff"] <= 1e-5  # the stored draws are rounded to 5 decimals
    data = bench.load_dataset(bench.us.DATASETS["upright"][0], size)
    draws = bench.us.q_draws(SimpleNamespace(model=model, guide=guide), data, size, 0)
    assert np.max(np.abs(draws.round(5) - np.asarray(unit["q_draws"]))) <= 1e-5  # the reloaded state is the fit
    assert bench.main(_args(tmp_path, "refine")) == 0
    _, _, _, _, refined = bench.load_state(tmp_path / "refined" / f"{UNIT}.pt")
    assert refined["refine"] == {**bench.REFINE, "num_particles": size["iwae_K"]}
    assert len(refined["refine_history"]["elbo"]) == bench.REFINE["steps"]
    assert bench.main(_args(tmp_path, "evaluate")) == 0
    ev = json.loads((tmp_path / "evaluated" / f"{UNIT}.json").read_text())
    assert ev["q_eta"]["mean"] != pytest.approx(unit["full_bayes"]["q_eta"]["mean"], abs=1e-6)  # q(η) was trained
    assert {"nll", "accuracy"} <= set(ev["metrics"]) and ev["iwae"]["K"] == size["iwae_K"]
    with pytest.raises(SystemExit):  # the reference's window is missing
        bench.main(_args(tmp_path, "profile"))
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "upright_seed0.json").write_text(json.dumps({"window": [0, 6, 12, 36]}))
    assert bench.main(_args(tmp_path, "profile")) == 0
    prof = json.loads((tmp_path / "profile" / f"{UNIT}.json").read_text())
    assert prof["etas"] == pytest.approx(
        [0.0, math.pi / 6, math.pi / 3, math.pi]
    )  # 0 and π held inside only when fixed
    assert all(math.isfinite(v) for k in ("elbo_fit", "refined") for v in prof[k]) and prof["K"] == size["iwae_K"]
    with pytest.raises(SystemExit):  # the other units' references are missing
        bench.main(_args(tmp_path, "render"))
