"""Comparison tables a user can act on: ± on every bound in every format, one unit (per datum) said in the
header, flags for k̂ > 0.7 and for fits that have not converged, the difference to the best row ± its
standard error, the same held-out numbers as ``fit``, error bars in the plot, a PSIS warning that says
what it means."""

import json
import math
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.container import BarContainer

import pyro_invariance as pi
from pyro_invariance.cli import main
from pyro_invariance.diagnostics.compare import (
    GuideComparison,
    default_bound_samples,
    difference_to_best,
    elbo_trace_change,
    is_converged,
    row_flags,
)
from pyro_invariance.infer.bounds import PSIS_MIN_DRAWS, PSIS_MIN_TAIL, psis_khat, psis_tail_size

SMALL_DATA = {"train_size": 12, "test_size": 6}
SMALL_MODEL = {"num_features": 4}


@pytest.fixture(scope="module")
def table():
    """Stopped after 40 steps: the mean-field guide's ELBO is still rising, and it is a poor proposal (k̂ = inf)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pi.compare_guides(
            "basis-regression",
            "basis-toy",
            ["mean-field", "map"],
            steps=40,
            seed=2,
            K=(5, 20),
            eval_samples=2,
            bound_vectorize=True,
            model_kwargs={"num_features": 6},
        )


def _synthetic(rows, Ks=(10,)):
    settings = {"n_eval": 10, "n_train": 10, "model": "m", "data": "d", "steps": 5, "seed": 0, "bound_samples": 20}
    return GuideComparison([{"metrics": {}, **r} for r in rows], settings, "regression", Ks)


# ------------------------------------------------------------------------------------------------ ± and units


def test_every_bound_has_its_standard_error_in_text_markdown_and_json(table):
    kmax = max(table.Ks)
    assert table.settings["bound_samples"] == default_bound_samples(table.Ks) == max(2 * kmax, PSIS_MIN_DRAWS)
    text_rows = table.to_text().splitlines()
    md_rows = [line for line in table.to_markdown().splitlines() if line.startswith("| ")][1:]
    for r in table.rows:
        if not r["is_bound"]:
            continue
        for key in ["elbo"] + [f"iwae{k}" for k in table.Ks]:
            assert math.isfinite(r[f"{key}_se"]) and r[f"{key}_se"] > 0, key  # two IWAE estimates at the largest K
            cell = f"{r[key]:.4f} ± {r[f'{key}_se']:.4f}"
            assert any(line.startswith(r["guide"] + " ") and cell in line for line in text_rows), (cell, key)
            assert any(line.startswith(f"| {r['guide']} |") and cell in line for line in md_rows), (cell, key)
    payload = json.loads(table.to_json())
    for r in payload["rows"]:
        assert {
            "elbo_se",
            *(f"iwae{k}_se" for k in table.Ks),
            "elbo_minus_best",
            "elbo_minus_best_se",
            f"iwae{kmax}_minus_best",
            f"iwae{kmax}_minus_best_se",
            "flags",
        } <= set(r)


def test_one_unit_per_datum_said_in_the_header(table):
    kmax = max(table.Ks)
    header = table.header()
    assert ["ELBO/N", "IWAE5/N", "IWAE20/N", "log Z/N", "ELBO/N − best", f"IWAE{kmax}/N − best"] == header[3:9]
    assert not any("−ELBO" in h or "- ELBO" in h for h in header)  # no column in total nats
    text = table.to_text().splitlines()
    assert "nats per datum" in text[1] and f"n = {table.settings['n_eval']}" in text[1]  # above the table
    notes = [line for line in table.to_markdown().splitlines() if line.startswith("- ")]
    assert "nats per datum" in notes[0]
    assert not any("nats for all n" in line for line in table.notes())


# ------------------------------------------------------------------------------------------------ difference


def test_difference_to_the_best_row_against_a_hand_computation():
    rows = [
        {
            "guide": "a",
            "is_bound": True,
            "elbo": -1.0,
            "elbo_se": 0.03,
            "iwae10": -0.5,
            "iwae10_se": 0.06,
            "k_hat": 0.3,
        },
        {
            "guide": "b",
            "is_bound": True,
            "elbo": -1.2,
            "elbo_se": 0.04,
            "iwae10": -0.4,
            "iwae10_se": 0.03,
            "k_hat": 0.4,
        },
        {
            "guide": "c",
            "is_bound": True,
            "elbo": -1.1,
            "elbo_se": float("nan"),
            "iwae10": -0.9,
            "iwae10_se": 0.01,
            "k_hat": 0.2,
        },
        {
            "guide": "map",
            "is_bound": False,
            "elbo": 0.5,
            "elbo_se": 0.0,
            "iwae10": 0.5,
            "iwae10_se": 0.0,
            "k_hat": float("nan"),
        },  # highest number, but not a bound: never the best
    ]
    cmp = _synthetic(rows)
    elbo = difference_to_best(cmp.rows, "elbo")
    assert elbo[0] == (0.0, 0.0) and elbo[3] is None
    assert elbo[1] == pytest.approx((-0.2, math.sqrt(0.03**2 + 0.04**2)))  # 0.05
    assert elbo[2][0] == pytest.approx(-0.1) and math.isnan(elbo[2][1])
    iwae = difference_to_best(cmp.rows, "iwae10")
    assert iwae[1] == (0.0, 0.0)
    assert iwae[0] == pytest.approx((-0.1, math.hypot(0.06, 0.03)))
    assert iwae[2] == pytest.approx((-0.5, math.hypot(0.01, 0.03)))
    cells = {row[0]: row for row in cmp.table_rows()}
    col = cmp.header().index("ELBO/N − best")
    assert [cells[g][col] for g in "abc"] == ["best", "-0.2000 ± 0.0500", "-0.1000 ± n/a"] and cells["map"][col] == "-"
    assert cells["a"][col + 1] == "-0.1000 ± 0.0671"
    payload = cmp.to_dict()["rows"]
    assert payload[1]["elbo_minus_best"] == pytest.approx(-0.2) and payload[1]["elbo_minus_best_se"] == pytest.approx(
        0.05
    )
    assert payload[3]["elbo_minus_best"] is None
    notes = "\n".join(cmp.notes())
    assert "Highest ELBO/N: a; no usable error to compare with: c." in notes  # b is 4 se below: separated
    assert "Highest IWAE10/N: b; within 2 se of it (not separated): a." in notes  # c is 15 se below


# ------------------------------------------------------------------------------------------------ flags


def test_flags_for_khat_and_convergence_on_synthetic_rows():
    base = {"is_bound": True, "convergence": {"converged": True}}
    assert row_flags({**base, "k_hat": 0.69}) == []
    assert row_flags({**base, "k_hat": 0.71}) == ["k̂>0.7"]
    assert row_flags({**base, "k_hat": math.inf}) == ["k̂>0.7"]
    assert row_flags({**base, "k_hat": math.nan}) == ["k̂ n/a"]
    assert row_flags({"is_bound": False, "k_hat": math.nan, "convergence": {"converged": True}}) == []  # point estimate
    assert row_flags({**base, "k_hat": 0.2, "convergence": {"converged": False}}) == ["moving"]
    assert row_flags({**base, "k_hat": 0.2, "convergence": {"converged": None}}) == ["short"]
    assert row_flags({"is_bound": True, "k_hat": 0.2}) == []  # a table saved before the rule: nothing to judge


def _noise(n, seed=0, sd=0.3):
    return (sd * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)).tolist()


def test_the_convergence_rule_on_synthetic_traces():
    n = 200
    rising = {"elbo": [0.01 * i + e for i, e in enumerate(_noise(n))], "lr": [0.01] * n}
    flat = {"elbo": _noise(n, seed=1), "lr": [0.01] * n}
    trace = elbo_trace_change(rising)
    assert trace["previous_steps"] == trace["last_steps"] == 20  # constant rate: the last 10 % of the steps
    assert trace["change"] == pytest.approx(0.2, abs=3 * trace["change_se"])  # 20 steps of slope 0.01
    assert is_converged(trace["change"], trace["change_se"], bound_se=0.01) is False
    assert is_converged(trace["change"], trace["change_se"], bound_se=1.0) is True  # within the bound's own ±
    flat_trace = elbo_trace_change(flat)
    assert is_converged(flat_trace["change"], flat_trace["change_se"], bound_se=0.01) is True
    short = elbo_trace_change({"elbo": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], "lr": [0.01] * 8})
    assert short["change"] is None and is_converged(short["change"], short["change_se"], 0.1) is None


def test_the_rule_reads_learning_rate_time_so_an_annealed_rate_does_not_hide_a_rising_bound():
    """Cosine to 0: the ELBO rose in proportion to the rate until the rate vanished. The last 10 % of the
    steps are flat (the rate is ≈ 0 there), the last 10 % of Σ lr is not."""
    n = 300
    lr = [0.5 * (1 + math.cos(math.pi * t / n)) for t in range(n)]
    tau = [sum(lr[: t + 1]) / sum(lr) for t in range(n)]
    history = {"elbo": [5.0 * t + e for t, e in zip(tau, _noise(n, seed=3, sd=0.05))], "lr": lr}
    trace = elbo_trace_change(history)
    assert trace["last_steps"] > 0.3 * n  # the annealed tail holds most of the last 10 % of the rate's time
    assert trace["change"] == pytest.approx(0.5, abs=0.1)  # 10 % of the rise
    assert is_converged(trace["change"], trace["change_se"], bound_se=0.05) is False
    by_steps = elbo_trace_change({"elbo": history["elbo"]})  # no rates: equal shares of the steps
    assert by_steps["change"] < 0.05  # what a rule on the last steps would see
    assert is_converged(by_steps["change"], by_steps["change_se"], bound_se=0.05) is True


def test_a_fit_stopped_early_is_flagged_in_every_format(table):
    mf = next(r for r in table.rows if r["guide"] == "mean-field")
    assert mf["convergence"]["converged"] is False and "moving" in row_flags(mf)
    for r in table.rows:
        k = r["k_hat"]
        assert ("k̂>0.7" in row_flags(r)) == (r["is_bound"] and k > 0.7)
    col = table.header().index("flags")
    cells = {row[0]: row[col] for row in table.table_rows()}
    assert "moving" in cells["mean-field"]
    assert "moving" in next(line for line in table.to_text().splitlines() if line.startswith("mean-field "))
    payload = json.loads(table.to_json())
    assert "moving" in next(r for r in payload["rows"] if r["guide"] == "mean-field")["flags"]
    assert any(line.startswith("flags:") and "10 %" in line for line in table.notes())  # the rule is stated


def test_saved_tables_round_trip_and_old_ones_still_render(table):
    again = GuideComparison.from_dict(json.loads(table.to_json()))
    assert again.to_markdown() == table.to_markdown()
    old = json.loads(table.to_json())
    for r in old["rows"]:  # a table written before flags, differences and convergence existed
        for key in (
            "flags",
            "convergence",
            "elbo_minus_best",
            "elbo_minus_best_se",
            "iwae20_minus_best",
            "iwae20_minus_best_se",
        ):
            r.pop(key)
    text = GuideComparison.from_dict(old).to_text()
    assert "moving" not in text.split("\n\n")[1] and "ELBO/N − best" in text


# ------------------------------------------------------------------------------------------------ plot


def test_plot_has_error_bars_of_one_standard_error_and_marks_flagged_rows():
    rows = [
        {
            "guide": "a",
            "is_bound": True,
            "elbo": -1.0,
            "elbo_se": 0.05,
            "iwae10": -0.5,
            "iwae10_se": float("nan"),
            "k_hat": 0.9,
            "convergence": {"converged": False},
        },
        {
            "guide": "b",
            "is_bound": True,
            "elbo": -1.2,
            "elbo_se": 0.1,
            "iwae10": -0.4,
            "iwae10_se": 0.02,
            "k_hat": 0.3,
            "convergence": {"converged": True},
        },
    ]
    fig = _synthetic(rows).plot()
    ax = fig.axes[0]
    elbo_bars = next(c for c in ax.containers if isinstance(c, BarContainer))  # the first bound: the ELBO
    segments = elbo_bars.errorbar.lines[2][0].get_segments()
    assert [seg[1][1] - seg[0][1] for seg in segments] == pytest.approx([0.1, 0.2])  # ± se around each value
    texts = [t.get_text() for t in ax.texts]
    assert "±?" in texts  # a's IWAE has no usable error: said, not drawn as 0
    assert any("moving" in t for t in texts) and any("0.7" in t for t in texts)
    assert [t.get_color() for t in ax.get_xticklabels()] == ["C3", "k"]
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ held out


def test_fit_and_compare_report_the_same_held_out_numbers_for_the_same_run(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "fit",
        "--model",
        "basis-regression",
        "--data",
        "basis-toy",
        "--guide",
        "mean-field",
        "--steps",
        "15",
        "--seed",
        "5",
        "--eval-samples",
        "3",
        "--train-size",
        "12",
        "--test-size",
        "6",
        "--model-arg",
        "num_features=4",
        "--no-progress",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    summary = json.loads((out / "result.json").read_text())["summary"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # too few draws for PSIS here
        cmp = pi.compare_guides(
            "basis-regression",
            "basis-toy",
            ["mean-field"],
            steps=15,
            seed=5,
            eval_samples=3,
            K=(2,),
            data_kwargs=SMALL_DATA,
            model_kwargs=SMALL_MODEL,
            threads=1,
        )
    row = cmp.rows[0]
    assert row["train_elbo_minibatch"] == summary["final_elbo_per_datum_train_minibatch"]  # the same run
    assert row["metrics"] == summary["metrics"]
    assert summary["eval_seed"] == cmp.settings["eval_seed"] == 5


# ------------------------------------------------------------------------------------------------ PSIS warning


def test_the_psis_warning_for_too_few_weights_does_not_contradict_itself():
    assert psis_tail_size(PSIS_MIN_DRAWS) >= PSIS_MIN_TAIL > psis_tail_size(PSIS_MIN_DRAWS - 1)
    gen = torch.Generator().manual_seed(0)
    with pytest.warns(UserWarning) as record:
        assert math.isnan(psis_khat(torch.randn(10, generator=gen)))
    message = str(record[0].message)
    assert message.startswith("10 log weights are too few for PSIS k̂")
    assert "largest 2" in message and f"≥ {PSIS_MIN_TAIL}" in message and f"draw ≥ {PSIS_MIN_DRAWS}" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the threshold is the tail's: the first size with a tail of 10 has a k̂
        assert math.isfinite(psis_khat(torch.randn(PSIS_MIN_DRAWS, generator=gen)))
    with pytest.warns(UserWarning, match=f"largest {PSIS_MIN_TAIL - 1},"):
        psis_khat(torch.randn(PSIS_MIN_DRAWS - 1, generator=gen))
