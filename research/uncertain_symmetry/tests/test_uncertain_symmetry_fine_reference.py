"""The 1° reference near the mode
(``research/uncertain_symmetry/scripts/uncertain_symmetry_fine_reference.py``): its points, the fits at the
quick size (restart by restart, resumable, repeating the reference's fit where the points coincide), and the
curvature summary against exact quadratics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script

QUICK = Path(__file__).resolve().parents[1] / "results" / "uncertain_symmetry_quick.json"
STEP = math.pi / 36


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_fine_reference")


def _reference(values: dict[int, float], restarts: int = 2) -> dict:
    """A refined-reference unit with the bound ``values[j]`` at 5° point j for every restart (restart r offset by r)."""
    return {
        "dataset": "upright",
        "seed": 0,
        "window": sorted(values),
        "fits": [
            {"j": j, "eta": j * STEP, "restart": r, "iwae": {"value": v + r}, "source": "fitted"}
            for j, v in values.items()
            for r in range(restarts)
        ],
    }


def test_settings_are_the_stated_ones(bench) -> None:
    assert bench.K_CHECK == 1000 and bench.K_CHECK_UNITS == (("upright", 0), ("upright", 2))
    assert bench.FINE_DATASETS == ("upright", "partially-rotated") and bench.FINE_RESTARTS == 4
    assert bench.FINE_SPACING == pytest.approx(math.pi / 180) and bench.FINE_HALF_WIDTH == 0.2


def test_points_sit_around_the_references_best_point(bench) -> None:
    top, etas = bench.fine_points(_reference({j: -((j - 5) ** 2) for j in range(2, 9)}))
    assert top == pytest.approx(5 * STEP) and len(etas) == 23
    assert np.allclose(np.diff(etas), math.pi / 180) and etas[11] == pytest.approx(top)
    # near η = 0 the points stop inside (0, π)
    _, low = bench.fine_points(_reference({j: -((j - 1) ** 2) for j in range(0, 5)}))
    assert min(low) > 0 and 16 <= len(low) <= 17  # 5° + i·1° for i ≥ −4 (i = −5 is η = 0 up to rounding)


def test_summary_recovers_an_exact_quadratic_and_uses_whole_restarts(bench) -> None:
    etas = list(0.5 + np.arange(-11, 12) * math.pi / 180)
    profile = [-0.5 * ((e - 0.52) / 0.05) ** 2 for e in etas]
    fits = [
        {"k": k, "eta": e, "restart": r, "iwae": {"value": profile[k] + 3.0 * r}}
        for r in range(3)
        for k, e in enumerate(etas)
    ]
    fits += [{"k": 0, "eta": etas[0], "restart": 3, "iwae": {"value": 0.0}}]  # an unfinished restart
    unit = {"dataset": "upright", "seed": 0, "eta0": 0.5, "etas": etas, "fits": fits}
    assert bench.complete_restarts(unit) == [0, 1, 2]
    out = bench.fine_summary(unit)
    assert out["restarts"] == [0, 1, 2] and out["points"] == 23
    assert out["c"] == pytest.approx(-1 / (2 * 0.05**2), rel=1e-9) and out["sd"] == pytest.approx(0.05, rel=1e-9)
    assert out["sigma"] == pytest.approx(0.0, abs=1e-9) and out["residual_sd"] == pytest.approx(0.0, abs=1e-6)
    assert out["grid_sd"] == pytest.approx(
        0.05, rel=0.03
    )  # the 1° grid posterior (piecewise-linear, truncated at 4 sd)
    rc = out["restart_curvature"]  # (d): every restart has the same shape
    assert np.allclose(rc["each_c"], out["c"]) and rc["se"] == pytest.approx(0.0, abs=1e-6)
    assert rc["sd_interval"] == pytest.approx([0.05, 0.05], rel=1e-6)
    # restarts of different shape: their curvatures' spread gives the t interval
    bent = [{**f, "iwae": {"value": f["iwae"]["value"] + 40.0 * f["restart"] * (f["eta"] - 0.5) ** 2}} for f in fits]
    rc = bench.fine_summary({**unit, "fits": bent})["restart_curvature"]
    assert np.allclose(np.diff(rc["each_c"]), 40.0) and rc["se"] == pytest.approx(40.0 / math.sqrt(3), rel=1e-6)
    assert rc["sd_interval"][0] < bench.usc.implied_sd(rc["c"]) < rc["sd_interval"][1]
    with pytest.raises(ValueError, match="no restart is complete"):
        bench.fine_summary({**unit, "fits": fits[-1:]})


def test_fits_run_restart_by_restart_resume_and_repeat_the_reference(bench, tmp_path, monkeypatch) -> None:
    from uncertain_symmetry import SIZES

    monkeypatch.setattr(bench, "FINE_HALF_WIDTH", 2 * math.pi / 180)  # 5 points at the quick size
    size = {k: SIZES["quick"][k] for k in SIZES["default"]}
    ref = _reference({j: -((j - 6) ** 2) for j in range(4, 9)})
    path = tmp_path / "upright_seed0.json"
    unit = bench.fit_unit("upright", 0, ref, size, path, 0)
    assert [f["restart"] for f in unit["fits"]] == [0] * 5 and path.read_text() == json.dumps(unit, indent=1) + "\n"
    again = bench.fit_unit("upright", 0, ref, size, path, 0)  # resumed: nothing refitted
    assert json.dumps(again) == json.dumps(unit)
    unit = bench.fit_unit("upright", 0, ref, size, path, 1)
    assert bench.complete_restarts(unit) == [0, 1]
    assert all(math.isfinite(f["iwae"]["value"]) for f in unit["fits"])
    # the fit at the 5° point η₀ repeats a reference fit with the same seed: put its value in the reference
    centre = next(f for f in unit["fits"] if f["k"] == 2 and f["restart"] == 1)
    ref["fits"] = [
        {**f, "iwae": {"value": centre["iwae"]["value"]}} if (f["j"], f["restart"]) == (6, 1) else f
        for f in ref["fits"]
    ]
    assert bench.repeats_reference({**unit, "fits": [centre]}, ref) == 0.0
    moved = [{**f, "restart": 0, "k": 2} for f in unit["fits"] if f["k"] == 2 and f["restart"] == 1]
    assert bench.repeats_reference({**unit, "fits": moved}, ref) > 0.0
    with pytest.raises(SystemExit, match="points are not"):
        bench.fit_unit("upright", 0, _reference({j: -((j - 7) ** 2) for j in range(4, 10)}), size, path, 2)
    # (e): restart 0 refitted repeats its bound, and is evaluated at a second K (resumable)
    monkeypatch.setattr(bench, "K_CHECK", 7)
    check_path = tmp_path / "upright_seed0_k7.json"
    check = bench.k_check_unit("upright", 0, unit, size, check_path)
    assert [p["k"] for p in check["points"]] == list(range(5)) and check["K"] == 7
    assert all(p["repeat_difference"] < 1e-6 and math.isfinite(p["iwae_more"]) for p in check["points"])
    assert json.dumps(bench.k_check_unit("upright", 0, unit, size, check_path)) == json.dumps(check)
    # (f): restart 1 joins the same file, with its own training seed; then both K's are references of two restarts
    check = bench.k_check_unit("upright", 0, unit, size, check_path, restart=1)
    assert sorted((p["k"], p["restart"]) for p in check["points"]) == [(k, r) for k in range(5) for r in (0, 1)]
    assert all(p["repeat_difference"] < 1e-6 for p in check["points"])
    as_reference = bench.k_check_reference(check, "iwae")
    assert bench.complete_restarts(as_reference) == [0, 1]
    assert sorted(f["iwae"]["value"] for f in as_reference["fits"]) == sorted(
        f["iwae"]["value"] for f in unit["fits"] if f["restart"] < 2
    )
    out = bench.k_check_summary(check)
    assert out["points"] == 5 and set(out["reference"]) == {"K100", "K7"}
    assert out["reference"]["K100"]["sd"] == pytest.approx(
        bench.fine_summary({**unit, "fits": [f for f in unit["fits"] if f["restart"] < 2]})["sd"]
    )


def test_k_check_summary_finds_the_curvature_of_the_difference(bench) -> None:
    etas = 0.5 + np.arange(-11, 12) * math.pi / 180
    base = -0.5 * ((etas - 0.5) / 0.05) ** 2
    more = base + 2.0 + 30.0 * (etas - 0.5) ** 2 + 0.5 * (etas - 0.5)  # K's gap bends the profile by +30 nats/rad²
    check = {
        "dataset": "upright",
        "seed": 0,
        "eta0": 0.5,
        "etas": list(etas),
        "points": [
            {"k": k, "restart": 0, "eta": e, "iwae": b, "iwae_more": m, "repeat_difference": 0.0, "k_hat_more": 0.1 * k}
            for k, (e, b, m) in enumerate(zip(etas, base, more))
        ],
    }
    out = bench.k_check_summary(check)
    assert out["points"] == 23 and out["sd"] == pytest.approx(0.05) and out["diff_c"] == pytest.approx(30.0)
    assert out["sd_more"] == pytest.approx(bench.usc.implied_sd(-1 / (2 * 0.05**2) + 30.0))
    assert out["diff_se"] == pytest.approx(0.0, abs=1e-6) and out["diff_range"] == pytest.approx(
        [(more - base).min(), (more - base).max()]
    )
    assert out["k_hat_range"] == pytest.approx([0.0, 2.2]) and "reference" not in out  # one restart: no (f)
    assert "| upright, 0 | 23 | 0.050 |" in bench.k_check_table([("upright", 0, out)])


def test_render_refuses_a_missing_unit(bench, tmp_path) -> None:
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    (ref_dir / "upright_seed0.json").write_text(json.dumps(_reference({j: -((j - 6) ** 2) for j in range(4, 9)})))
    with pytest.raises(SystemExit):
        bench.main(
            [
                "--from",
                str(QUICK),
                "--reference",
                str(ref_dir),
                "--work-dir",
                str(tmp_path / "fine"),
                "--render",
                "--only",
                "upright_seed0",
            ]
        )
