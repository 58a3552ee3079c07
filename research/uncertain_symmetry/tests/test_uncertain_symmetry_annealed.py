"""The AIS reference (``research/uncertain_symmetry/scripts/uncertain_symmetry_annealed.py``): its settings,
the quantile stand-in for q(η), combining the halves, one tiny run that resumes, and the tables from synthetic
units with a known posterior."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_annealed")


def test_settings(bench) -> None:
    assert len(bench.ETAS) == 21 and bench.ETAS[0] == 0.10 and bench.ETAS[-1] == 1.10
    assert np.allclose(np.diff(bench.ETAS), 0.05)
    assert bench.CHECK_ETA in bench.ETAS and bench.CHECK_SEED in bench.SEEDS
    assert bench.HALVES == (0, 1) and bench.SAMPLING == "deterministic"
    assert bench.SCANS["upright"] == bench.ETAS + bench.UPRIGHT_EXTENSION + bench.UPRIGHT_TAIL
    assert bench.CHECK_DATASET == "upright" and bench.UPRIGHT_TAIL[-1] == 3.1
    assert bench.UPRIGHT_EXTENSION[0] == 1.2 and bench.UPRIGHT_EXTENSION[-1] == 2.0
    assert set(bench.LONG_ETAS) <= set(bench.SCANS["upright"]) and 0.8 in bench.LONG_ETAS
    assert bench.LONG_TEMPERATURES == 4 * bench.TEMPERATURES
    assert bench.SCANS["rotated"][-1] == pytest.approx(math.pi) and len(bench.SCANS["partially-rotated"]) == 16
    rotated = np.array(bench.SCANS["rotated"])  # (k): the rotated reference can put mass below 2.4 rad
    assert np.all(np.diff(rotated) > 0) and rotated[0] < 2.4 - 0.5 and len(bench.SCANS["rotated"]) == 13
    assert bench.PARTIAL_EXTRA[-1] == pytest.approx(math.pi) and min(bench.PARTIAL_EXTRA) > max(
        bench.SCANS["partially-rotated"]
    )


def test_logit_normal_draws_have_the_stored_quantiles(bench) -> None:
    draws = bench.logit_normal_draws(0.33, 0.41)
    assert np.quantile(draws, 0.05) == pytest.approx(0.33, abs=1e-3)
    assert np.quantile(draws, 0.95) == pytest.approx(0.41, abs=1e-3)
    assert 0 < draws.min() and draws.max() < math.pi


def _half(
    seed: int, half: int, etas: np.ndarray, values: np.ndarray, chains: int = 4, dataset: str = "upright"
) -> dict:
    points = [
        {
            "eta": float(e),
            "log_evidence": float(v),
            "log_weights": [float(v)] * chains,
            "weight_sd": 0.0,
            "acceptance": 0.7,
            "edge_share": 0.001,
            "sigma_mode": 15.0,
        }
        for e, v in zip(etas, values)
    ]
    return {"dataset": dataset, "seed": seed, "half": half, "points": points}


def test_combine_pools_the_chains_and_measures_the_noise(bench) -> None:
    etas = np.array(bench.ETAS)
    a, b = -300 + np.zeros(len(etas)), -300 + np.where(np.arange(len(etas)) % 2 == 0, 1.0, -1.0)
    c = bench.combine([_half(0, 0, etas, a), _half(0, 1, etas, b)])
    assert c["combined"] == pytest.approx(np.log((np.exp(a - a) + np.exp(b - a)) / 2) + a)
    assert c["noise"] == pytest.approx(np.std((a - b) / 2, ddof=1))
    assert c["each"].shape == (2, len(etas))


def test_a_tiny_run_resumes(bench, tmp_path, monkeypatch) -> None:
    from pyro_invariance.data import load_dataset

    data = load_dataset("digits", train_size=300, test_size=450)
    path = tmp_path / "unit.json"
    unit = bench.run_unit(data, "upright", 0, 0, path, etas=(0.3, 0.5), chains=2, temperatures=41)
    assert [p["eta"] for p in unit["points"]] == [0.3, 0.5]
    point = unit["points"][0]
    assert math.isfinite(point["log_evidence"]) and len(point["log_weights"]) == 2
    assert point["profile"]["log_scale"][0] < point["profile"]["log_scale"][-1]
    calls = []
    monkeypatch.setattr(bench, "evaluate_point", lambda *a, **k: calls.append(a) or {})
    again = bench.run_unit(data, "upright", 0, 0, path, etas=(0.3, 0.5))
    assert calls == [] and again == json.loads(path.read_text())


def test_no_quadratic_from_fewer_than_three_points(bench) -> None:
    etas = np.array([2.1, 2.2, 2.3, 2.5, 2.7, 2.9, math.pi])  # within two spacings (0.2) of 2.9: 2.7 and 2.9
    width = bench.implied_width(etas, np.array([-9.0, -8.0, -7.0, -5.0, -1.0, 0.0, -2.0]), 0.5)
    assert width["eta0"] == 2.9 and width["points"] == 2 and math.isnan(width["sd"])


def test_render_recovers_a_known_posterior(bench, tmp_path) -> None:
    """Units whose log evidence is the log density of N(0.5, 0.06²) on the scan: the AIS posterior and the quadratic
    give sd 0.06; the stored q(η) of the earlier runs are judged against it."""
    etas = np.array(bench.SCANS["upright"])
    for seed in bench.SEEDS:
        for half in bench.HALVES:
            values = -300 - 0.5 * ((etas - 0.5) / 0.06) ** 2 + (0.01 if half else 0.0)
            (tmp_path / f"{bench.unit_name('upright', seed, half)}.json").write_text(
                json.dumps(_half(seed, half, etas, values))
            )
    long_etas = np.array(bench.LONG_ETAS)
    for half in bench.HALVES:  # (i): T = 4000 one nat higher everywhere, and 0.5 nat more at 1.4 rad
        values = -299 - 0.5 * ((long_etas - 0.5) / 0.06) ** 2 + 0.5 * (long_etas == 1.4)
        (tmp_path / f"long_{bench.unit_name('upright', 0, half)}.json").write_text(
            json.dumps(_half(0, half, long_etas, values))
        )
    md, js = bench.render(tmp_path, bench.common.RESULTS_DIR, tmp_path)
    payload = json.loads(js.read_text())
    for s in payload["seeds"]:
        assert s["summary"]["mode"] == pytest.approx(0.5)
        assert s["summary"]["sd"] == pytest.approx(0.06, rel=0.1)
        assert s["implied"]["sd"] == pytest.approx(0.06, rel=1e-6)
        assert s["iwae_reference"]["points"] > 5
    assert len(payload["overlaps"]) == 3 * len(bench.Q_SOURCES)
    assert payload["quantile_stand_in_error"] < 0.05
    long = {p["eta"]: p for p in payload["long_check"]}
    assert long[1.4]["long"] - long[1.4]["short"] == pytest.approx(1.5, abs=0.01)  # the scan's half 1 is 0.01 higher
    assert long[0.8]["long"] - long[0.8]["short"] == pytest.approx(1.0, abs=0.01)
    text = md.read_text()
    assert "Shape change from T = 1000 to 4000: +0.00 to +0.50 nats" in text
    assert "## The issue's overlap criterion against this reference (f)" in text and "| not run |" in text
