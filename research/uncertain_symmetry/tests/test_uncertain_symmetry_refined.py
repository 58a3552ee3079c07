"""The refined grid reference (``research/uncertain_symmetry/scripts/uncertain_symmetry_refined.py``): the
window rule, the refined evidence (larger restart on the window, coarse points elsewhere), refusal of inputs
with another reference, and a tiny end-to-end run (fits, resume, render)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from research.uncertain_symmetry.tests.helpers import load_script

QUICK = Path(__file__).resolve().parents[1] / "results" / "uncertain_symmetry_quick.json"


@pytest.fixture(scope="module")
def ref():
    return load_script("uncertain_symmetry_refined")


def test_window_spans_every_interval_with_a_margin_and_stays_in_range(ref) -> None:
    step = math.pi / 36
    js = ref.window([(10.2 * step, 12.5 * step), (11.0 * step, 14.9 * step)])
    assert js == list(range(10 - 2, 15 + 2 + 1))
    assert ref.window([(0.1 * step, 1.0 * step)]) == [0, 1, 2, 3]  # clipped at 0
    assert ref.window([(35.2 * step, math.pi)])[-1] == 36  # clipped at π
    assert ref.window([(3 * step, 3 * step)], margin=0) == [3]  # a grid point is not widened by rounding


def test_refined_points_on_the_window_only_under_both_rules(ref) -> None:
    """``aligned-mean``: restart 1 shifted by its mean difference to restart 0 over the
    window, then averaged; ``larger``: the larger bound; coarse points outside the window unchanged."""
    step = math.pi / 36
    coarse = [{"eta": j * step, "iwae": {"value": -float(j)}} for j in (0, 3, 6, 9)]
    fits = [
        {"j": j, "eta": j * step, "restart": r, "iwae": {"value": v}}
        for j, r, v in [(3, 0, -3.0), (3, 1, -2.5), (4, 0, -7.0), (4, 1, -8.5)]
    ]
    # offset d = mean(0.5, −1.5) = −0.5; aligned restart 1: −2.0 at j = 3, −8.0 at j = 4
    for rule, at3, at4 in [("aligned-mean", -2.5, -7.5), ("larger", -2.5, -7.0)]:
        points = ref.refined_points(coarse, {"fits": fits}, rule)
        assert [round(p["eta"] / step) for p in points] == [0, 3, 4, 6, 9]
        by_j = {round(p["eta"] / step): p for p in points}
        assert by_j[3]["iwae"]["value"] == pytest.approx(at3) and by_j[4]["iwae"]["value"] == pytest.approx(at4)
        assert by_j[3]["restarts"] == [-3.0, -2.5] and by_j[3]["coarse"] and not by_j[4]["coarse"]
        assert by_j[6] == {**coarse[2], "coarse": True} and "restarts" not in by_j[0]
    noise = ref.restart_noise({"fits": fits}, num_train=10)
    # aligned restart 1: −2.0, −8.0 against −3.0, −7.0: per-point variances 0.5, 0.5
    assert noise["offsets"] == pytest.approx([0.0, -0.5]) and noise["offsets_per_datum"][1] == pytest.approx(-0.05)
    assert noise["point_sd"] == pytest.approx(0.5**0.5) and noise["mean_sd"] == pytest.approx(0.5)
    assert noise["restarts"] == 2 and noise["points"] == 2
    assert ref.first_restarts({"fits": fits, "x": 1}, 1) == {"fits": [fits[0], fits[2]], "x": 1}
    grid, values = ref.aligned_mean({"fits": fits}, lambda f: f["iwae"]["value"])  # the rule, for any value
    assert grid == pytest.approx([3 * step, 4 * step]) and values == pytest.approx([-2.5, -7.5])
    with pytest.raises(ValueError, match="rule must be one of"):
        ref.refined_points(coarse, {"fits": fits}, "median")


def test_inputs_with_another_reference_or_settings_are_refused(ref, tmp_path) -> None:
    payload = json.loads(QUICK.read_text())
    other = json.loads(QUICK.read_text())
    other["settings"]["guide"] = "symmetry-conditional"  # the guide may differ
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    paths[0].write_text(json.dumps(payload))
    paths[1].write_text(json.dumps(other))
    assert len(ref.load_inputs(paths)) == 2
    other["units"][0]["type_ii"]["eta"] += 0.1
    paths[1].write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="is not .*a.json's"):
        ref.load_inputs(paths)
    other = json.loads(QUICK.read_text())
    other["settings"]["steps"] += 1
    paths[1].write_text(json.dumps(other))
    with pytest.raises(SystemExit, match=r"differ from .*a.json's in \['steps'\]"):
        ref.load_inputs(paths)


def test_a_tiny_refinement_runs_resumes_extends_and_renders(ref, tmp_path, monkeypatch) -> None:
    """On the quick run's upright seed 0, with a two-point window (a coarse point and its neighbour) and
    two restarts: three new fits (the coarse point's restart 0 is reused); a second run refits nothing;
    a third restart extends the unit (the render refuses it until then); ``--q-restart`` refits q(η)
    with another training seed; the render evaluates both inputs' criteria (and the second q(η)'s)."""
    monkeypatch.setattr(ref, "window", lambda intervals, margin=ref.MARGIN: [18, 19])
    monkeypatch.setattr(ref, "RESTARTS", 2)
    work = tmp_path / "work"
    args = [
        "--from",
        str(QUICK),
        str(QUICK),
        "--names",
        "a,b",
        "--work-dir",
        str(work),
        "--datasets",
        "upright",
        "--seeds",
        "0",
        "--out-dir",
        str(tmp_path),
    ]
    with pytest.warns(UserWarning, match="too few for PSIS"):  # the quick run's K = 10
        assert ref.main(args) == 0
    path = work / "upright_seed0.json"
    unit = json.loads(path.read_text())
    assert [(f["j"], f["restart"], f["source"]) for f in unit["fits"]] == [
        (18, 0, "coarse grid (stored)"),
        (18, 1, "fitted"),
        (19, 0, "fitted"),
        (19, 1, "fitted"),
    ]
    assert unit["fits"][1]["iwae"] != unit["fits"][0]["iwae"]  # another training seed
    before = path.read_text()
    assert ref.main(args) == 0 and path.read_text() == before
    monkeypatch.setattr(ref, "RESTARTS", 3)
    with pytest.raises(SystemExit):
        ref.main([*args, "--render"])  # restart 2 is missing
    with pytest.warns(UserWarning, match="too few for PSIS"):
        assert ref.main(args) == 0
    extended = json.loads(path.read_text())
    assert extended["fits"][:2] == unit["fits"][:2] and [(f["j"], f["restart"]) for f in extended["fits"]] == [
        (18, 0),
        (18, 1),
        (18, 2),
        (19, 0),
        (19, 1),
        (19, 2),
    ]
    assert ref.main([*args, "--q-restart"]) == 0  # both inputs use the mean-field guide: one refit
    again = json.loads((work / "q_mean-field_upright_seed0.json").read_text())
    assert again["train_seed"] == 1000 and len(again["q_draws"]) == 200
    assert ref.main([*args, "--render"]) == 0
    out = json.loads((tmp_path / "uncertain_symmetry_refined_quick.json").read_text())
    assert list(out["verdicts"]) == [
        label
        for n in "ab"
        for label in (
            f"{n}: coarse grid",
            f"{n}: refined, 2 restarts, larger",
            f"{n}: refined, 2 restarts, aligned-mean",
            f"{n}: refined, 3 restarts, aligned-mean",
        )
    ] + [f"{n}, training seed + 1000: refined, 3 restarts, aligned-mean" for n in "ab"]
    assert out["settings"]["refined fits"] == 5
    assert out["q_restart_units"]["a"][0]["full_bayes"]["q_eta"] == again["q_eta"]
    u = out["units"]["a"][0]
    assert sum("restarts" in p for p in u["grid"]["points"]) == 2 and u["restart_noise"]["restarts"] == 3
    assert len(u["restarts_alone"]) == 3
    assert u["elbo_grid"]["grid"] == pytest.approx([18 * math.pi / 36, 19 * math.pi / 36])
    assert 0.0 <= u["elbo_grid"]["overlap"]["q_in_grid90"] <= 1.0
    assert sum(p["coarse"] for p in u["grid"]["points"]) == 5  # the quick run's coarse grid, all kept
    md = (tmp_path / "uncertain_symmetry_refined_quick.md").read_text()
    assert "against the refined reference: a" in md and "upright: overlaps grid" in md and "Verdicts by reference" in md
    assert "q(η) from a second training seed: a" in md
    with pytest.raises(SystemExit):
        ref.main([*args[:-2], "--seeds", "1", "--render"])  # no refined unit for seed 1
