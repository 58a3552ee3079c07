"""The data-size benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_datasize.py``): its
settings, a tiny real run in two parts that resumes, and the tables from synthetic units: an evidence whose
top moves down with N is read as moving, one that stays is not, and the N = 300 check finds a changed
value."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_datasize")


def test_settings(bench) -> None:
    assert bench.SIZES == (300, 600, 1200) and bench.DATASETS == ("upright", "partially-rotated")
    assert len(bench.ETAS) == 13 and bench.ETAS[0] == 0.1 and bench.ETAS[-1] == math.pi
    assert np.allclose(np.diff(bench.ETAS[:-1]), 0.25)
    assert bench.UNITS[0] == (0, "upright", 300) and bench.UNITS[-1] == (1, "partially-rotated", 1200)
    assert (bench.NUM_SCALES, bench.SCALE_SPAN) == (bench.usl.NUM_SCALES, bench.usl.SCALE_SPAN)


def test_a_tiny_run_in_two_parts_resumes(bench, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "ETAS", (0.4, 1.2))
    monkeypatch.setattr(bench, "NUM_SCALES", 2)
    monkeypatch.setattr(bench, "HELDOUT_DRAWS", 8)
    paths = [bench.unit_path(tmp_path, "upright", 40, 0, k) for k in (0, 1)]
    units = [bench.run_unit("upright", 40, 0, p, k, 2) for k, p in enumerate(paths)]
    assert [[q["eta"] for q in u["points"]] for u in units] == [[0.4], [1.2]]
    q = units[1]["points"][0]
    assert math.isfinite(q["log_evidence"]) and 0 < q["nll"] < math.inf and 0 <= q["accuracy"] <= 1
    pred = bench.predictive_unit("upright", 40, 0, tmp_path)  # (e) on the complete unit
    assert pred["points_mixed"] in (1, 2) and all(0 < pred[k]["nll"] < math.inf for k in ("full_bayes", "type_ii"))
    mode_point = max(units, key=lambda u: u["points"][0]["log_evidence"])["points"][0]
    if pred["points_mixed"] == 1:  # one point holds the mass: full Bayes is type-II
        assert pred["full_bayes"] == pred["type_ii"]
    monkeypatch.setattr(bench, "evaluate_point", lambda *a, **k: pytest.fail("a finished point ran again"))
    monkeypatch.setattr(bench, "laplace_symmetry_predictive", lambda *a, **k: pytest.fail("a finished unit ran again"))
    assert bench.run_unit("upright", 40, 0, paths[0], 0, 2) == json.loads(paths[0].read_text())
    assert bench.predictive_unit("upright", 40, 0, tmp_path) == pred
    # type-II is the Laplace predictive of the fixed-η model at the mode, held out on the same test digits
    assert abs(pred["type_ii"]["nll"] - mode_point["nll"]) < 1e-6


def _write_unit(bench, work, dataset, size, seed, top) -> None:
    etas = np.array(bench.ETAS)
    ell = -size * 0.8 - 0.5 * size / 30 * (etas - top) ** 2  # sharper with N, as an evidence is
    nll = 0.3 + 0.05 * (etas - top) ** 2
    pts = [
        {
            "eta": float(e),
            "log_evidence": float(v),
            "sigma_mode": 15.0,
            "newton_steps": 40,
            "nll": float(h),
            "accuracy": 0.9,
            "seconds": 1.0,
        }
        for e, v, h in zip(etas, ell, nll)
    ]
    for k in (0, 1):
        bench.unit_path(work, dataset, size, seed, k).write_text(
            json.dumps({"dataset": dataset, "size": size, "seed": seed, "points": pts[k::2]})
        )


def test_render_reads_moving_and_staying_tops(bench, tmp_path) -> None:
    work, lap = tmp_path / "units", tmp_path / "lap"
    work.mkdir(), lap.mkdir()
    for seed in (0, 2):
        for size, top in zip(bench.SIZES, (2.1, 1.35, 0.6)):  # upright: the top moves down with N
            _write_unit(bench, work, "upright", size, seed, top)
        for size in bench.SIZES:  # ±90°: it stays
            _write_unit(bench, work, "partially-rotated", size, seed, 2.35)
    # upright seed 0 at N = 1200 incomplete: left out
    bench.unit_path(work, "upright", 1200, 1, 0).write_text(
        json.dumps({"dataset": "upright", "size": 1200, "seed": 1, "points": []})
    )
    shared = {0.1: -240.0 - 0.5 * 10 * 2.0**2, 0.6: -240.0 - 0.5 * 10 * 1.5**2 + 0.25}  # N = 300, seed 0: 0.25 nats off
    (lap / "upright_seed0_part0.json").write_text(
        json.dumps({"points": [{"eta": e, "log_evidence": v} for e, v in shared.items()]})
    )
    (work / "predictive_upright_n600_seed2.json").write_text(
        json.dumps(
            {
                "full_bayes": {"nll": 0.41, "accuracy": 0.9},
                "type_ii": {"nll": 0.43, "accuracy": 0.89},
                "points_mixed": 3,
            }
        )
    )
    md, js = bench.render(work, lap, tmp_path)
    out = json.loads(js.read_text())
    assert out["moves_down"] == {"upright": "2/2", "partially-rotated": "0/2"}
    assert len(out["units"]) == 12 and out["check"] == pytest.approx(0.25)
    up = {(u["size"], u["seed"]): u for u in out["units"] if u["dataset"] == "upright"}
    assert up[(1200, 0)]["location"][0] and not up[(300, 0)]["location"][0]
    assert up[(600, 2)]["best_eta"] == pytest.approx(1.35) and up[(600, 2)]["nll_at_top"] == pytest.approx(0.0)
    text = md.read_text()
    assert "upright 2/2 seeds, partially-rotated 0/2 seeds" in text
    row = next(line for line in text.splitlines() if line.startswith("| upright | 1200 | 2 |"))
    assert "| 2/2 |" in row and "0.60 ± 0.00" in row
    assert "| upright | 600 | 2 | 0.4100 / 0.900 | 0.4300 / 0.890 | -0.0200 | 3 |" in text
    assert md.with_suffix(".png").exists()


def test_bad_part_is_refused(bench) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--run", "--part", "2/2"])
    with pytest.raises(SystemExit):
        bench.main(["--run", "--seeds", "7"])
