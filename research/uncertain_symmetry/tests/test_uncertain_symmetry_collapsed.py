"""The collapsed-q(η) benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_collapsed.py``) at
the quick size: a warmed-up unit (``uncertain_symmetry_warmup.py --fit``) is collapsed on two streams, the
first with held-out metrics, the phases refuse to run out of order, and the diagnostic (e) is what its
docstring says."""

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
    return load_script("uncertain_symmetry_collapsed")


def _args(work: Path, states: Path, phase: str) -> list[str]:
    return [
        "--from",
        str(QUICK),
        "--reference",
        str(work / "reference"),
        "--work-dir",
        str(work),
        "--states",
        str(states),
        f"--{phase}",
        "--only",
        UNIT,
    ]


def test_settings_are_the_stated_ones(bench) -> None:
    assert bench.NUM_POINTS == 181 and bench.NOISE_SEED_OFFSET == 1
    assert (
        bench.ELBO_STREAMS == 128 and bench.ELBO_SPACING == pytest.approx(math.pi / 180) and bench.ELBO_MARGIN == 0.35
    )
    assert bench.ELBO_FITS == ("rbf", "linear")
    assert bench.STREAMS == 100 and bench.STREAM_BATCH == 20 and bench.RESOLUTION_REPLICATES == 200
    assert bench.CURVATURE_HALF_WIDTH == 0.2
    assert bench.FITS == {
        "rbf": ("rbf", ""),
        "linear": ("linear", ""),
        "no-warm-up": ("no-warm-up", ""),
        "rbf, refined": ("rbf", "_refined"),
        "linear, refined": ("linear", "_refined"),
    }


def test_a_warmed_up_unit_is_collapsed_on_two_streams(bench, tmp_path, monkeypatch) -> None:
    warm = load_script("uncertain_symmetry_warmup")
    states = tmp_path / "warm"
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
    monkeypatch.setattr(bench, "NUM_POINTS", 9)  # the quick size
    work = tmp_path / "collapsed"
    with pytest.raises(SystemExit):  # render before any collapse
        bench.main(_args(work, states, "render"))
    assert bench.main(_args(work, states, "collapse")) == 0
    first, second = (json.loads((work / "collapsed" / f"{UNIT}_noise{k}.json").read_text()) for k in (0, 1))
    assert first["noise_seed"] == 0 and second["noise_seed"] == 1
    assert len(first["grid"]) == 9 and first["grid"] == second["grid"] and first["profile"] != second["profile"]
    assert all(math.isfinite(v) for v in first["profile"]) and math.isfinite(first["log_marginal"])
    assert {"nll", "accuracy"} <= set(first["metrics"]) and "metrics" not in second  # held-out: first stream only
    draws = np.asarray(first["q_draws"])
    assert draws.min() >= first["grid"][0] - 1e-5 and draws.max() <= first["grid"][-1] + 1e-5
    # the collapse is the library's, on the saved fit, with the unit's seed
    from research.uncertain_symmetry.collapsed_symmetry import collapse_symmetry

    model, guide, x, y, _ = warm.load_state(states / "states" / f"{UNIT}.pt")
    again = collapse_symmetry(
        model, guide, x, y, num_points=9, K=int(json.loads(QUICK.read_text())["settings"]["iwae_K"]), seed=0
    )
    assert np.allclose(again.posterior.log_evidence, first["profile"], rtol=0, atol=1e-9)
    for phase in ("render", "elbo", "streams"):  # the reference is missing
        with pytest.raises(SystemExit):
            bench.main(_args(work, states, phase))
    # (g) at a small size: 4 streams in blocks of 2 on the window's 1° points; the pooled bound of the same draws
    monkeypatch.setattr(bench, "STREAMS", 4)
    monkeypatch.setattr(bench, "STREAM_BATCH", 2)
    size = {"iwae_K": 3, "num_draws": 500}
    out = bench.streams_unit(states / "states" / f"{UNIT}.pt", size, 0.5, 0.52, "cpu")
    grid = np.asarray(out["grid"])
    assert (
        grid[0] == pytest.approx(0.15)
        and grid[-1] == pytest.approx(0.87)
        and np.allclose(np.diff(grid), math.pi / 180, rtol=0.02)
    )
    each = np.asarray(out["stream_profiles"])
    assert each.shape == (4, len(grid)) and out["streams"] == 4 and out["stream_batch"] == 2
    assert np.allclose(each.mean(0), out["profile"], atol=1e-3)  # kept rounded to 4 decimals
    model, guide, x, y, _ = warm.load_state(states / "states" / f"{UNIT}.pt")
    lib = collapse_symmetry(model, guide, x, y, grid=grid, K=3, streams=4, stream_batch=2, seed=0)
    assert np.allclose(lib.posterior.log_evidence, out["profile"], rtol=0, atol=1e-9)
    pool = np.log(np.exp(each - each.max(0)).mean(0)) + each.max(0)
    assert np.allclose(out["pooled"]["profile"], pool, atol=1e-3)
    assert out["profile_noise"] > 0 and out["pooled"]["noise"] >= 0 and len(out["edge_mass"]) == 2
    assert grid[0] - 1e-5 <= out["pooled"]["q_eta"]["q05"] <= out["pooled"]["q_eta"]["q95"] <= grid[-1] + 1e-5


def test_the_reference_resolution_diagnostic(bench) -> None:
    """(h): a q* profile N(0.5, 0.04²) on a 1° grid, seen at 5° points without noise, is wider than on the fine grid
    (the piecewise-linear density between coarse points), and noise spreads that sd; the reference's own sd is read
    on the same points."""
    fine = np.linspace(0.2, 1.2, 200)
    profile = -0.5 * ((fine - 0.5) / 0.04) ** 2
    step = math.pi / 36
    points = [
        {"eta": j * step, "iwae": {"value": float(-0.5 * ((j * step - 0.5) / 0.08) ** 2)}, "restarts": [0.0]}
        for j in range(2, 12)
    ]
    points += [{"eta": 1.5, "iwae": {"value": -200.0}}]  # a coarse point outside the window: not a window point
    unit = {"grid": {"points": points, "summary": {"sd": 0.081}}, "restart_noise": {"mean_sd": 2.0}}
    raw = {"grid": fine.tolist(), "profile": profile.tolist(), "q_eta": {"sd": 0.04}}
    out = bench.at_reference_resolution(raw, unit, 0)
    assert out["points"] == 9 and out["dropped"] == 1  # 2·5° = 0.175 lies below the fine grid's 0.2
    assert out["clean_sd"] > 0.045  # the 5° points' piecewise-linear density widens a 0.04-sd posterior
    assert out["reference_window_sd"] == pytest.approx(0.08, rel=0.15) and out["reference_sd"] == 0.081
    lo, hi = out["noisy_sd_range"]
    assert lo < out["clean_sd"] < hi and hi - lo > 0.005 and out["sigma"] == 2.0  # 2 nats at each point spread it
    assert bench.at_reference_resolution(raw, unit, 0) == out  # seeded


def test_the_reference_curvature_diagnostic(bench) -> None:
    """(i): an exact quadratic log evidence of sd 0.07 gives c = −1/(2·0.07²) and sd 0.07 back, with zero residuals; its
    interval is c ± 1.645 SE from σ/√R mapped to sd; points beyond 0.2 rad of the top are left out."""
    step = math.pi / 36
    points = [
        {"eta": j * step, "iwae": {"value": float(-0.5 * ((j * step - 0.52) / 0.07) ** 2)}, "restarts": [0.0]}
        for j in range(2, 12)
    ]
    unit = {"grid": {"points": points, "summary": {"sd": 0.07}}, "restart_noise": {"mean_sd": 2.0}}
    cur = bench.reference_curvature(unit)
    assert cur["eta0"] == pytest.approx(6 * step) and cur["points"] == 5
    assert cur["c"] == pytest.approx(-1 / (2 * 0.07**2), rel=1e-9) and cur["sd"] == pytest.approx(0.07, rel=1e-9)
    assert cur["residual_sd"] == pytest.approx(0.0, abs=1e-9)
    x = (np.arange(-2, 3) * step) ** 2
    se = 2.0 / math.sqrt(((x - x.mean()) ** 2).sum())  # a quadratic's curvature on 5 even points
    assert cur["se_noise"] == pytest.approx(se, rel=1e-9)
    lo, hi = cur["sd_interval"]
    assert lo == pytest.approx(bench.implied_sd(cur["c"] - 1.645 * se)) and lo < 0.07 < hi
    assert bench.implied_sd(0.0) == math.inf and bench.implied_sd(-50.0) == pytest.approx(0.1)


def test_the_two_stream_diagnostic(bench) -> None:
    grid = np.linspace(0.1, 3.0, 30)
    profile = -0.5 * ((grid - 1.0) / 0.2) ** 2
    one = {"grid": grid.tolist(), "profile": profile.tolist(), "density": np.exp(profile).tolist()}
    shifted = {**one, "profile": (profile + 7.0).tolist()}
    assert bench.shape_noise(one, shifted) == pytest.approx(0.0, abs=1e-12)  # a shared level is not noise
    bumped = {**one, "profile": (profile + np.where(grid > 1.0, 1.0, -1.0)).tolist()}
    assert bench.shape_noise(one, bumped) > 0.5
    both = bench.two_streams(one, shifted, 4000, 0)
    assert both["q_eta"]["mean"] == pytest.approx(1.0, abs=0.02)  # the mean profile's q*: N(1, 0.2²) on the grid
    assert both["q_eta"]["sd"] == pytest.approx(0.2, rel=0.05)
