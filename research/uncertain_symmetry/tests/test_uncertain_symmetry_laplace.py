"""The Laplace-against-AIS benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_laplace.py``):
its points, a tiny real run that resumes (two parts), and the tables from synthetic units: a constant error
holds the overlap, a tilt fails it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_laplace")


def test_points_are_the_ais_scan(bench) -> None:
    usa = bench.usa
    assert bench.points("upright") == usa.SCANS["upright"]
    assert bench.points("partially-rotated") == usa.SCANS["partially-rotated"] + usa.PARTIAL_EXTRA
    assert {d for d, _ in bench.UNITS} == set(usa.SCANS) and {s for _, s in bench.UNITS} == set(usa.SEEDS)
    assert bench.NUM_SCALES == 29 and bench.SCALE_SPAN == (-2.0, 5.0)


def test_a_tiny_run_in_two_parts_resumes(bench, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "points", lambda dataset: (0.4, 1.2))
    monkeypatch.setattr(bench, "NUM_SCALES", 2)
    paths = [bench.unit_path(tmp_path, "upright", 0, k) for k in (0, 1)]
    units = [bench.run_unit("upright", 0, p, k, 2) for k, p in enumerate(paths)]
    assert [[q["eta"] for q in u["points"]] for u in units] == [[0.4], [1.2]]
    assert all(math.isfinite(q["log_evidence"]) and len(q["profile"]) == 2 for u in units for q in u["points"])
    monkeypatch.setattr(bench, "HELDOUT_DRAWS", 8)
    held = bench.heldout_unit("upright", 0, tmp_path, 1, 2)  # (d) at part 1's point, with its σ_p
    assert [q["eta"] for q in held["points"]] == [1.2] and held["points"][0]["sigma"] == units[1]["points"][0][
        "sigma_mode"
    ]
    assert (
        0 < held["points"][0]["nll"] < math.inf and 0 <= held["points"][0]["accuracy"] <= 1
    )  # σ_p = e^5 here: overconfident
    monkeypatch.setattr(bench, "evaluate_point", lambda *a, **k: pytest.fail("a finished point ran again"))
    monkeypatch.setattr(bench, "laplace_readout_predictive", lambda *a, **k: pytest.fail("a finished point ran again"))
    assert bench.run_unit("upright", 0, paths[0], 0, 2) == json.loads(paths[0].read_text())
    assert bench.heldout_unit("upright", 0, tmp_path, 1, 2) == held


def _ais_half(seed: int, half: int, etas: np.ndarray, values: np.ndarray, dataset: str) -> dict:
    points = [
        {
            "eta": float(e),
            "log_evidence": float(v),
            "log_weights": [float(v)] * 4,
            "weight_sd": 0.0,
            "acceptance": 0.7,
            "edge_share": 0.001,
            "sigma_mode": 15.0,
        }
        for e, v in zip(etas, values)
    ]
    return {"dataset": dataset, "seed": seed, "half": half, "points": points}


def test_render_a_constant_error_holds_and_a_tilt_fails(bench, tmp_path) -> None:
    ais_dir, lap_dir = tmp_path / "ais", tmp_path / "lap"
    ais_dir.mkdir(), lap_dir.mkdir()
    etas = np.array(bench.points("upright"))
    truth = -300 - 0.5 * ((etas - 1.5) / 0.3) ** 2
    for seed, error in ((0, np.full(len(etas), -10.0)), (2, -10.0 + 20.0 * etas)):  # seed 2: 60 nats of tilt
        for half in (0, 1):
            path = ais_dir / f"{bench.usa.unit_name('upright', seed, half)}.json"
            path.write_text(json.dumps(_ais_half(seed, half, etas, truth, "upright")))
        for k in (0, 1):
            pts = [
                {
                    "eta": float(e),
                    "log_evidence": float(t + r),
                    "sigma_mode": 12.0,
                    "newton_steps": 40,
                    "profile": [],
                    "seconds": 20.0,
                }
                for e, t, r in list(zip(etas, truth, error))[k::2]
            ]
            bench.unit_path(lap_dir, "upright", seed, k).write_text(
                json.dumps({"dataset": "upright", "seed": seed, "points": pts})
            )
    nll = 0.3 + 0.01 * (etas - 1.0) ** 2  # (d) for seed 0 only: lowest at 1.0 rad
    held = [{"eta": float(e), "nll": float(v), "accuracy": 0.9, "sigma": 12.0} for e, v in zip(etas, nll)]
    (lap_dir / "heldout_upright_seed0_part0.json").write_text(
        json.dumps({"dataset": "upright", "seed": 0, "points": held})
    )
    md, js = bench.render(lap_dir, ais_dir, bench.common.RESULTS_DIR, tmp_path)
    units = {u["seed"]: u for u in json.loads(js.read_text())["units"]}
    assert set(units) == {0, 2} and units[0]["points"] == len(etas)
    assert units[0]["error_mean"] == pytest.approx(-10.0) and units[0]["error_shape_sd"] == pytest.approx(0.0, abs=1e-9)
    assert units[0]["holds"] and units[0]["laplace_posterior"]["mode"] == pytest.approx(1.5)
    assert not units[2]["holds"] and units[2]["error_spread"] == pytest.approx(20.0 * (etas[-1] - etas[0]))
    assert units[2]["laplace_posterior"]["mode"] > 2.5
    assert units[0]["iwae_minus_ais"][0] < 0  # the refined IWAE reference lies below this (synthetic) evidence
    assert "upright 1/2" in md.read_text()
    h = units[0]["heldout"]
    assert units[2]["heldout"] is None and h["best_eta"] == pytest.approx(1.0)
    assert h["at_ais_top"] == pytest.approx(0.01 * 0.5**2)  # the synthetic evidence's top is at 1.5 rad
    assert "## Held-out NLL along η (d)" in md.read_text()
