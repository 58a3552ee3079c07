"""``benchmarks/eta_learning.py``: the convergence rule, the budget, the criteria and the evidence columns do what
its docstring fixes; ``--smoke`` runs both tables end to end and resumes from its unit files without refitting; the
committed result files end with the Verdict the script reads off their own JSON."""

from __future__ import annotations

import json
import math

import _common as common
import eta_learning as el
import pytest

LEVELS = (1000, 2000, 4000, 8000)


def fit(steps: int, eta: float, elbo: float) -> dict:
    return {"steps": steps, "eta": eta, "elbo_per_datum": elbo}


def test_a_unit_converges_at_the_first_doubling_that_moves_eta_and_the_elbo_little():
    moving = [fit(1000, 0.6, -1.50), fit(2000, 1.2, -1.40), fit(4000, 1.23, -1.395)]
    status = el.unit_status(moving, LEVELS)
    assert status["state"] == "converged" and status["steps"] == 4000 and status["fit"]["eta"] == 1.23
    # η settled but the ELBO still rising: not converged, the next length is due
    status = el.unit_status([fit(1000, 1.0, -1.50), fit(2000, 1.02, -1.48)], LEVELS)
    assert status == {"state": "running", "steps": 4000, "fit": fit(2000, 1.02, -1.48)}
    capped = [fit(s, 0.2 * i, -1.0) for i, s in enumerate(LEVELS)]
    assert el.unit_status(capped, LEVELS)["state"] == "not converged (cap)"
    assert el.unit_status([], LEVELS) == {"state": "running", "steps": 1000, "fit": None}


def test_units_the_budget_stopped_are_reported_so_and_a_stopped_run_is_not_a_verdict():
    points = [{"dataset": "rotated", "seed": 0, "cpu_seconds": 30.0, **fit(1000, 2.0, -1.0)}]
    units = el.statuses(points, [0], LEVELS, spent=100.0, limit=120.0)  # 2000 more steps need 60 s
    assert units[("rotated", 0)]["state"] == "not converged (CPU budget)" and not units[("rotated", 0)]["holds"]
    assert units[("upright", 0)]["fit"] is None and units[("upright", 0)]["state"] == "not converged (CPU budget)"
    assert "**Not reproduced**" in el.verdict_b(units, el.evidence_reference(), [0], "full")
    units = el.statuses(points, [0], LEVELS, spent=100.0, limit=3600.0)
    assert units[("rotated", 0)]["state"] == "unfinished"
    assert "**Not run** (3 of 3 units unfinished" in el.verdict_b(units, el.evidence_reference(), [0], "full")


def test_the_budget_refuses_a_fit_that_would_pass_it():
    budget = el.Budget(100.0, [{"table": "b", "cpu_seconds": 50.0, "steps": 1000}])
    budget.check("b", 1000)  # 50 + 50 ≤ 100
    with pytest.raises(el.BudgetExhausted):
        budget.check("b", 2000)
    budget.check("a", 1000)  # no fit of table a yet: the default rate, 30 s
    budget.add({"table": "a", "cpu_seconds": 40.0, "steps": 1000})
    with pytest.raises(el.BudgetExhausted):
        budget.check("a", 1000)


def test_the_criteria():
    assert el.criterion_b("partially-rotated", math.pi / 2 + 0.49) and not el.criterion_b("partially-rotated", 2.1)
    assert el.criterion_b("rotated", 2.5) and not el.criterion_b("rotated", 2.3)
    assert el.criterion_b("upright", 0.9) and not el.criterion_b("upright", 1.1)
    assert el.criterion_a("ELBO (σ_p = 1)", 2.5) and not el.criterion_a("ELBO (σ_p = 1)", 2.0)
    assert el.criterion_a("MAP (σ_p = 1)", 0.4) and not el.criterion_a("ML (σ_p = 1000)", 1.5)


def test_the_why_columns_compare_the_evidence_with_the_elbo_along_eta():
    # evidence rising by 10 nats per rad, the fixed-η ELBO (× N) falling by 5 per rad: its gap grows by 15 per rad
    ref = {
        "ais_etas": [0.0, 1.0, 2.0, 3.0],
        "ais_log_evidence": [-100.0, -90.0, -80.0, -70.0],
        "ais_mode": 3.0,
        "meanfield_elbo": [(0.5, -205.0), (1.0, -210.0), (2.0, -220.0)],
        "num_train": 100,
    }
    why = el.why_columns(1.0, -2.0, ref)
    assert why["evidence_gain"] == pytest.approx(20.0)
    assert why["gap_here"] == pytest.approx(-90.0 + 200.0)
    assert why["window"] == pytest.approx({"from": 1.0, "to": 2.0, "evidence_gain": 10.0, "gap_growth": 20.0})
    assert el.why_columns(4.0, -2.0, ref)["gap_here"] is None  # outside the AIS scan


def test_the_evidence_is_read_for_every_unit():
    refs = el.evidence_reference()
    assert set(refs) == {(ds, s) for ds in el.DATASETS_B for s in el.SEEDS}
    assert all(0 < r["ais_mode"] <= math.pi and r["num_train"] == 300 for r in refs.values())


def test_smoke_runs_both_tables_and_resumes_without_refitting(tmp_path, monkeypatch):
    args = ["--smoke", "--seeds", "0", "--out-dir", str(tmp_path)]
    assert el.main(args) == 0
    for stem in (el.STEM_A, el.STEM_B):
        text = (tmp_path / f"{stem}_smoke.md").read_text()
        assert text.rstrip().endswith("**Not run** (smoke size: its numbers test nothing).")
    assert (tmp_path / f"{el.STEM_A}_smoke.png").stat().st_size > 0
    units = tmp_path / "eta_learning_units"
    a, b = (json.loads((units / f"{n}.json").read_text())["points"] for n in ("map_vs_elbo", "converged"))
    assert len(a) == len(el.ROWS_A) and 3 <= len(b) <= 3 * len(el.SIZES["smoke"]["b_levels"])
    starts = {p["row"]: p["w2_mean_abs"] for p in json.loads((units / "map_vs_elbo_starts.json").read_text())["points"]}
    # the map guide starts at prior draws' median (σ_p = 1000: large weights); from 0 on request
    assert starts["ML (σ_p = 1000)"] > 10 and starts["ML (σ_p = 1000), from W2 = 0"] < 0.1

    def refit(*_args, **_kwargs):
        raise AssertionError("a finished fit was run again")

    monkeypatch.setattr(el, "run_fit", refit)
    assert el.main(args) == 0
    assert json.loads((units / "converged.json").read_text())["points"] == b

    monkeypatch.undo()  # past the cap: only the new length is fitted, into a file of its own
    assert el.main([*args, "--tables", "b", "--cap", "16"]) == 0
    longer = json.loads((units / "converged.json").read_text())["points"]
    capped = [
        key
        for key in {(p["dataset"], p["seed"]) for p in b}
        if el.unit_status([p for p in b if (p["dataset"], p["seed"]) == key], (4, 8))["state"] == "not converged (cap)"
    ]
    assert longer[: len(b)] == b and [p["steps"] for p in longer[len(b) :]] == [16] * len(capped)
    assert "(the last is the cap): `[4, 8, 16]`" in (tmp_path / f"{el.STEM_B}_cap16_smoke.md").read_text()
    with pytest.raises(SystemExit):  # not a doubling of the cap
        el.main([*args, "--tables", "b", "--cap", "12"])


@pytest.mark.parametrize("stem", [el.STEM_A, el.STEM_B])
def test_committed_results_end_with_the_verdict_the_script_reads_off_them(stem):
    md, js = common.RESULTS_DIR / f"{stem}.md", common.RESULTS_DIR / f"{stem}.json"
    if not md.exists():
        pytest.skip(f"{md.name} not written yet")
    record, text = json.loads(js.read_text()), md.read_text()
    seeds = record["settings"]["seeds"]
    if stem == el.STEM_A:
        verdict = el.verdict_a(record["points"], seeds, "full")
    else:
        budget = record["budget"]
        units = el.statuses(record["points"], seeds, el.SIZES["full"]["b_levels"], budget["spent"], budget["limit"])
        verdict = el.verdict_b(units, el.evidence_reference(), seeds, "full")
    assert text[text.index("## Verdict") :].rstrip() == verdict.rstrip()
