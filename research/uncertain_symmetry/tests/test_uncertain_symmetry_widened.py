"""The widened re-training before the collapse
(``research/uncertain_symmetry/scripts/uncertain_symmetry_widened.py``): its settings, a unit at the quick
size equal to the library calls it names, the width measures against an exact quadratic, and the command
line's refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script

QUICK = Path(__file__).resolve().parents[1] / "results" / "uncertain_symmetry_quick.json"
UNIT = "rbf_upright_seed0"
SPACING = math.pi / 180


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_widened")


@pytest.fixture(scope="module")
def quick_state(tmp_path_factory) -> Path:
    """A warm-up fit at the quick size (``uncertain_symmetry_warmup.py --fit``)."""
    states = tmp_path_factory.mktemp("warm")
    warm = load_script("uncertain_symmetry_warmup")
    assert (
        warm.main(
            [
                "--from",
                str(QUICK),
                "--reference",
                str(states / "reference"),
                "--work-dir",
                str(states),
                "--fit",
                "--only",
                UNIT,
            ]
        )
        == 0
    )
    return states / "states" / f"{UNIT}.pt"


def _fine(values: np.ndarray, eta0: float = 0.5, restarts: int = 2, wiggle: float = 0.0) -> dict:
    """A 1° reference unit with the bound ``values[k]`` at point k: restart r offset by r and, for r = 1, 2, plus and
    minus ``wiggle`` times a zero-mean alternating pattern (the restarts' mean stays ``values`` + 1)."""
    half = len(values) // 2
    etas = [eta0 + (k - half) * SPACING for k in range(len(values))]
    pattern = (-1.0) ** np.arange(len(values))
    pattern -= pattern.mean()
    sign = {1: 1.0, 2: -1.0}
    return {
        "dataset": "upright",
        "seed": 0,
        "eta0": eta0,
        "etas": etas,
        "fits": [
            {
                "k": k,
                "eta": etas[k],
                "restart": r,
                "iwae": {"value": float(v) + r + sign.get(r, 0.0) * wiggle * pattern[k]},
            }
            for k, v in enumerate(values)
            for r in range(restarts)
        ],
    }


def test_settings_are_the_stated_ones(bench) -> None:
    assert bench.WIDEN == 3.0 and bench.EXTRA_STEPS == 2000 and bench.STREAMS == 20
    assert bench.SEEDS == (0, 2, 1) and bench.VARIANTS == ("rbf", "linear") and bench.DATASET == "upright"
    assert bench.TREATMENTS == {"widened": 3.0, "held": 1.0, "as fitted": None}
    assert (
        bench.K_CHECK_UNITS == tuple((v, s, "as fitted") for s in (0, 2) for v in ("rbf", "linear"))
        and bench.K_CHECK_STREAMS == 10
    )
    order = bench.units()
    assert len(order) == 18 and order[:3] == [("rbf", 0, "widened"), ("rbf", 0, "held"), ("rbf", 0, "as fitted")]
    assert [s for _, s, _ in order[::6]] == [0, 2, 1] and bench.unit_name(
        "linear", 2, "as fitted"
    ) == "linear_upright_seed2_as-fitted"


def test_widths_recover_an_exact_quadratic_and_the_gap_at_the_mode(bench) -> None:
    sd, n = 0.05, 23
    x = (np.arange(n) - n // 2) * SPACING
    profile = -(x**2) / (2 * sd**2) - 100.0
    streams = np.stack([profile + b * x for b in (-30.0, 0.0, 30.0)])  # slopes change no curvature
    fine = _fine(-(x**2) / (2 * 0.07**2) - 80.0)
    w = bench.widths(
        {"profile": streams.mean(0).tolist(), "stream_profiles": streams.tolist(), "profile_noise": 0.0}, fine
    )
    assert w["sd"] == pytest.approx(sd) and w["streams"]["c"] == pytest.approx(-1 / (2 * sd**2))
    assert w["streams"]["se"] == pytest.approx(0.0, abs=1e-6)
    assert w["gap_at_mode"] == pytest.approx(-80.0 + 0.5 - (-100.0))  # the reference's restarts averaged at η₀
    end = x[-1] ** 2 * (1 / (2 * sd**2) - 1 / (2 * 0.07**2))  # (f): the wider reference falls off less
    assert w["gap_growth_at_ends"] == pytest.approx(end)
    assert w["grid_sd"] == pytest.approx(sd, rel=0.02)  # ±3.8 sd of a Gaussian on 1° points, linear between them


def test_a_unit_is_the_library_calls_it_names(bench, quick_state, monkeypatch) -> None:
    from research.uncertain_symmetry.collapsed_symmetry import collapse_symmetry
    from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional

    warm = load_script("uncertain_symmetry_warmup")
    monkeypatch.setattr(bench, "STREAMS", 2)
    fine = _fine(np.zeros(5), eta0=0.6)
    grid = np.asarray(fine["etas"])
    for treatment, widen in (("widened", 3.0), ("as fitted", None)):
        unit = bench.run_unit(quick_state, fine, treatment, extra_steps=3)
        model, guide, x, y, meta = warm.load_state(quick_state)
        before = {k: v.clone() for k, v in guide.state_dict().items() if k.startswith(("locs.eta", "scales.eta"))}
        assert before  # the state's q(η)
        if widen is not None:
            warm_up_conditional(model, guide, (x, y), widen=widen, steps=3, seed=0, progress=False)
            assert unit["widen"] == widen and unit["extra_steps"] == 3 and math.isfinite(unit["final_elbo_per_datum"])
            assert all(np.array_equal(before[k], guide.state_dict()[k]) for k in before)  # q(η) restored
        else:
            assert "widen" not in unit and "train_seconds" not in unit
        again = collapse_symmetry(
            model, guide, x, y, grid=grid, K=int(meta["size"]["iwae_K"]), streams=2, stream_batch=1, seed=0
        )
        assert np.allclose(again.posterior.log_evidence, unit["profile"], rtol=0, atol=1e-9)
        assert np.asarray(unit["stream_profiles"]).shape == (2, 5) and unit["grid"] == fine["etas"]
        assert {"nll", "accuracy"} <= set(unit["metrics"]["gaussian"]) and {"nll", "accuracy"} <= set(
            unit["metrics"]["collapsed"]
        )
    # (g): the collapse at another K and number of streams, without held-out metrics
    unit = bench.run_unit(quick_state, fine, "as fitted", K=4, streams=3)
    model, guide, x, y, _ = warm.load_state(quick_state)
    again = collapse_symmetry(model, guide, x, y, grid=grid, K=4, streams=3, stream_batch=1, seed=0)
    assert np.allclose(again.posterior.log_evidence, unit["profile"], rtol=0, atol=1e-9)
    assert unit["K"] == 4 and unit["streams"] == 3 and "metrics" not in unit


def test_the_command_line_refuses_and_renders_what_ran(bench, tmp_path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--fit", "--only", "rbf_upright_seed7_widened"])
    with pytest.raises(SystemExit):  # the state is missing
        bench.main(
            [
                "--fit",
                "--states",
                str(tmp_path / "none"),
                "--work-dir",
                str(tmp_path / "w"),
                "--only",
                "rbf_upright_seed0_held",
            ]
        )
    assert not (tmp_path / "w" / "rbf_upright_seed0_held.json").exists()
    n, sd = 23, 0.05
    x = (np.arange(n) - n // 2) * SPACING
    fine_dir, work = tmp_path / "fine", tmp_path / "work"
    fine_dir.mkdir()
    work.mkdir()
    (fine_dir / "upright_seed0.json").write_text(json.dumps(_fine(-(x**2) / (2 * sd**2), restarts=3, wiggle=0.5)))
    streams = np.stack([-(x**2) / (2 * sd**2) + b * x for b in (-1.0, 1.0)])
    metrics = {"nll": 0.5, "accuracy": 0.9}
    unit = {
        "meta": {"variant": "rbf", "dataset": "upright", "seed": 0, "treatment": "widened"},
        "profile": streams.mean(0).tolist(),
        "stream_profiles": streams.tolist(),
        "profile_noise": 0.1,
        "streams": 2,
        "train_seconds": 1.0,
        "final_elbo_per_datum": -1.0,
        "collapse_seconds": 2.0,
        "metrics": {"gaussian": metrics, "collapsed": metrics},
    }
    (work / "rbf_upright_seed0_widened.json").write_text(json.dumps(unit))
    assert (
        bench.main(
            [
                "--render",
                "--fine",
                str(fine_dir),
                "--work-dir",
                str(work),
                "--collapsed",
                str(tmp_path / "none"),
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    md = (tmp_path / "out" / "uncertain_symmetry_widened_steps4000.md").read_text()
    assert "- widened: q* inside the 1° reference's interval (c) on 1 of 1 units" in md
    assert "- held: q* inside the 1° reference's interval (c) on 0 of 0 units" in md
    assert md.count("not run") == 17 and "## q* and the reference at K = 1000" not in md
    # (g): with the K = 1000 collapse and the reference's K check of three restarts, one row per K
    fine = _fine(-(x**2) / (2 * sd**2), restarts=3, wiggle=0.5)
    check = {
        "dataset": "upright",
        "seed": 0,
        "eta0": fine["eta0"],
        "etas": fine["etas"],
        "points": [
            {
                "k": f["k"],
                "restart": f["restart"],
                "eta": f["eta"],
                "iwae": f["iwae"]["value"],
                "iwae_more": f["iwae"]["value"] + 2.0,
            }
            for f in fine["fits"]
        ],
    }
    (fine_dir / "upright_seed0_k1000.json").write_text(json.dumps(check))
    as_fitted = {**unit, "meta": {**unit["meta"], "treatment": "as fitted"}}
    (work / "rbf_upright_seed0_as-fitted.json").write_text(json.dumps(as_fitted))
    (work / "rbf_upright_seed0_as-fitted_k1000.json").write_text(json.dumps({**as_fitted, "streams": 2, "K": 1000}))
    rows, lean = bench.k_check_rows(work, fine_dir)
    assert [r["K"] for r in lean] == [100, 1000] and all(r["fine"]["restarts"] == [0, 1, 2] for r in lean)
    assert all(r["widths"]["sd"] == pytest.approx(sd) and r["fine"]["sd"] == pytest.approx(sd) for r in lean)
    assert lean[1]["widths"]["gap_at_mode"] == pytest.approx(lean[0]["widths"]["gap_at_mode"] + 2.0)
    assert sum(row.startswith("| rbf | 0 |") for row in rows) == 2
