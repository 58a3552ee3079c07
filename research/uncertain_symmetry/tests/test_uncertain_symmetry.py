"""The uncertain-symmetry benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry.py``): its
statistics, its criteria, one tiny unit, and that the held-out evaluation of a full-Bayes model draws η
from ``q(η)``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_value

import pyro_invariance as pi
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior
from pyro_invariance.models import InvariantMLP
from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry")


def test_reflected_kde_mode_keeps_boundary_modes(bench) -> None:
    rng = np.random.default_rng(0)
    at_pi = math.pi - np.abs(rng.normal(0.0, 0.1, 4000))
    at_zero = np.abs(rng.normal(0.0, 0.1, 4000))
    middle = rng.normal(1.5, 0.2, 4000)
    assert bench.reflected_kde_mode(at_pi) > math.pi - 0.05
    assert bench.reflected_kde_mode(at_zero) < 0.05
    assert abs(bench.reflected_kde_mode(middle) - 1.5) < 0.1
    assert bench.reflected_kde_mode(np.full(10, 0.7)) == pytest.approx(0.7)


def test_overlap_of_matching_and_disjoint_distributions(bench) -> None:
    grid = np.linspace(0.0, math.pi, 401)
    log_ev = -0.5 * ((grid - 1.5) / 0.2) ** 2
    gp = grid_posterior(grid, log_ev, np.full_like(grid, -math.log(math.pi)))
    rng = np.random.default_rng(1)
    same = bench.overlap(rng.normal(1.5, 0.2, 20000), gp)
    assert same["q_in_grid90"] == pytest.approx(0.9, abs=0.02)
    assert same["grid_in_q90"] == pytest.approx(0.9, abs=0.02)
    narrow = bench.overlap(rng.normal(1.5, 0.02, 20000), gp)
    assert narrow["q_in_grid90"] > 0.99 and narrow["grid_in_q90"] < 0.2
    apart = bench.overlap(rng.normal(2.8, 0.05, 20000), gp)
    assert apart["q_in_grid90"] < 0.01 and apart["grid_in_q90"] < 0.01


def _unit(bench, dataset: str, seed: int, q_draws: np.ndarray, grid_centre: float) -> dict:
    grid = np.linspace(0.0, math.pi, 201)
    gp = grid_posterior(grid, -0.5 * ((grid - grid_centre) / 0.2) ** 2, np.full_like(grid, -math.log(math.pi)))
    return {
        "dataset": dataset,
        "seed": seed,
        "full_bayes": {"q_eta": bench.draw_summary(q_draws)},
        "grid": {"summary": bench.grid_summary(gp)},
        "overlap": bench.overlap(q_draws, gp),
    }


def test_criteria_verdicts_and_reasons(bench) -> None:
    rng = np.random.default_rng(2)
    units = [
        _unit(bench, "rotated", 0, np.clip(rng.normal(2.9, 0.15, 2000), 0, math.pi), 2.9),  # holds
        _unit(bench, "rotated", 1, rng.normal(1.0, 0.15, 2000), 2.9),  # q misses the reference
        _unit(bench, "upright", 0, rng.normal(2.0, 0.15, 2000), 2.0),  # the reference fails too
    ]
    rows = {r["criterion"]: r for r in bench.criteria(units)}
    rot = rows["rotated: mostly above 2.4"]
    assert rot["verdict"] == "partly" and [p["holds"] for p in rot["per_seed"]] == [True, False]
    assert "q(η) misses the reference" in rot["per_seed"][1]["why"]
    up = rows["upright: below 1.0"]
    assert up["verdict"] == "fails" and "fails it too" in up["per_seed"][0]["why"]
    assert rows["rotated: overlaps grid"]["per_seed"][0]["holds"]
    assert "apart" in rows["rotated: overlaps grid"]["per_seed"][1]["why"]
    assert "±90°: mode near π/2" not in rows  # no unit on that dataset


def test_evaluate_draws_eta_from_the_guide() -> None:
    """``pi.evaluate`` of a full-Bayes model replays η from ``q(η)`` in every draw (predictive and ELBO)."""
    torch.manual_seed(0)
    x, y = torch.rand(20, 1, 8, 8), torch.randint(0, 10, (20,))
    model = InvariantMLP(hidden=8, num_transforms=2, symmetry_prior="uniform")
    seen: list[float] = []
    original = InvariantMLP.sample_transforms

    def record(self, num_transforms=None, eta=None):
        seen.append(float(self.eta[0] if eta is None else eta[0]))
        return original(self, num_transforms, eta)

    narrow = pi.guides.get(
        "mean-field", model, init_loc_fn=init_to_value(values={"eta": torch.tensor([2.0])}), init_scale=1e-4
    )
    wide = pi.guides.get("mean-field", model)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(InvariantMLP, "sample_transforms", record)
        with pi.pyro_scope():
            narrow(x, y)
            wide(x, y)
        seen.clear()  # the guides' set-up traced the model
        pi.evaluate((model, narrow), (x, y), num_samples=4, num_particles=2)
        assert len(seen) == 6 and all(abs(v - 2.0) < 1e-2 for v in seen)  # q(η) ≈ δ(2), not the U(0, π) prior
        seen.clear()
        pi.evaluate((model, wide), (x, y), num_samples=4, num_particles=2)
        assert len(set(seen)) == 6  # a fresh η per draw


def test_one_tiny_unit_runs(bench) -> None:
    size = {
        "train_size": 40,
        "test_size": 20,
        "hidden": 8,
        "num_transforms": 2,
        "steps": 3,
        "grid_points": 3,
        "iwae_K": 4,
        "num_draws": 30,
        "eval_samples": 2,
    }
    with pytest.warns(UserWarning, match="too few for PSIS"):
        unit = bench.run_unit("upright", 0, size)
    unit["num_train"] = size["train_size"]
    assert len(unit["q_draws"]) == 30 and all(0.0 <= v <= math.pi for v in unit["q_draws"])
    assert [p["eta"] for p in unit["grid"]["points"]] == pytest.approx([0.0, math.pi / 2, math.pi])
    assert 0.0 <= unit["overlap"]["q_in_grid90"] <= 1.0
    assert "upright digits" in bench.render([unit], {}, dict(size, seeds=[0]), "x", 1.0, True)


def test_a_unit_takes_type_ii_and_the_grid_from_an_earlier_run(bench, tmp_path) -> None:
    """``--guide symmetry-conditional --reference-from``: only the full-Bayes fit is new; the type-II fit
    and the grid come from the earlier unit, and a run with other settings is refused."""
    import json

    size = {
        "train_size": 40,
        "test_size": 20,
        "hidden": 8,
        "num_transforms": 2,
        "steps": 3,
        "grid_points": 3,
        "iwae_K": 4,
        "num_draws": 30,
        "eval_samples": 2,
    }
    with pytest.warns(UserWarning, match="too few for PSIS"):
        earlier = bench.run_unit("upright", 0, size)
        fresh = dict(earlier["grid"]["summary"])
        earlier["grid"]["summary"]["mean"] = -1.0  # a stale summary (older code) is recomputed from the bounds
        unit = bench.run_unit("upright", 0, size, guide="symmetry-conditional", reference=earlier)
    assert unit["type_ii"] is earlier["type_ii"] and unit["grid"]["points"] is earlier["grid"]["points"]
    assert unit["grid"]["summary"] == pytest.approx(fresh)
    assert unit["q_draws"] != earlier["q_draws"]  # its own full-Bayes fit
    assert 0.0 <= unit["overlap"]["q_in_grid90"] <= 1.0
    settings = {**size, "guide": "mean-field", "model": "m", "fit config": {"lr": 0.05}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"settings": settings, "units": [earlier]}, default=float))
    mine = {**settings, "guide": "symmetry-conditional"}
    assert set(bench.reference_units(path, mine, {"lr": 0.05, "tf32": False})) == {("upright", 0)}
    with pytest.raises(SystemExit, match=r"differ in \['steps'\]"):
        bench.reference_units(path, {**mine, "steps": 4}, {"lr": 0.05})
    with pytest.raises(SystemExit, match=r"differ in \['fit config'\]"):
        bench.reference_units(path, mine, {"lr": 0.1})


def test_runs_on_other_datasets_merge_into_one_table(bench, tmp_path) -> None:
    """``--merge``: runs of one setting on other (dataset, seed) units become one results file; other
    settings or a repeated unit are refused."""
    rng = np.random.default_rng(3)
    a = {
        "info": {},
        "settings": {"steps": 4, "datasets": ["rotated-digits"], "seeds": [0]},
        "command": "a",
        "wall_seconds": 2.0,
        "complete": True,
        "units": [_unit(bench, "rotated", 0, rng.normal(2.9, 0.1, 200), 2.9)],
    }
    b = {
        "info": {},
        "settings": {"steps": 4, "datasets": ["digits"], "seeds": [1]},
        "command": "b",
        "wall_seconds": 3.0,
        "complete": True,
        "units": [_unit(bench, "upright", 1, rng.normal(0.2, 0.1, 200), 0.2)],
    }
    merged = bench.merge_runs([b, a], ["b.json", "a.json"])
    assert [(u["dataset"], u["seed"]) for u in merged["units"]] == [("rotated", 0), ("upright", 1)]
    assert merged["settings"]["datasets"] == ["rotated-digits", "digits"] and merged["settings"]["seeds"] == [0, 1]
    assert merged["wall_seconds"] == 3.0 and "--merge b.json a.json" in merged["command"]
    assert {r["criterion"] for r in merged["criteria"]} >= {"rotated: mostly above 2.4", "upright: below 1.0"}
    with pytest.raises(SystemExit, match=r"differ .* in \['steps'\]"):
        bench.merge_runs([a, {**b, "settings": {**b["settings"], "steps": 5}}], ["a.json", "c.json"])
    with pytest.raises(SystemExit, match="more than one file"):
        bench.merge_runs([a, a], ["a.json", "a2.json"])
