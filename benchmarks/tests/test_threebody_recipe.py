"""``benchmarks/threebody_recipe.py``: the reference's data semantics (a batch counts trajectories), resumable units
split over ``--part`` processes at ``--smoke`` size, and the committed table's Verdict read from its committed units."""

from __future__ import annotations

import json
import re

import _common as common
import pytest
import threebody_recipe as tb


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_presets_have_the_references_data_and_batches(preset):
    cfg = tb.PRESETS[preset]
    assert cfg["data"]["train_trajectories"] * cfg["data"]["train_steps"] == 10_000
    assert tb.batch_pairs(cfg, "rows") == 20 * 50 and tb.batch_pairs(cfg, "warmup") == 100 * 50
    assert (cfg["warmup"]["dt"], cfg["rows"]["dt"], cfg["rows"]["eta_lr"]) == (0.1, 1.0, 0.01)
    assert cfg["model"]["num_generators"] == 10 and cfg["model"]["sampling"] == "ball"
    if preset == "gpu":
        assert cfg["model"]["hidden"] == (250,) * 4 and cfg["model"]["num_transforms"] == 100
        assert cfg["rows"]["steps"] == 1000 * 10  # 1000 epochs of 10 steps


def test_smoke_units_split_over_two_parts_share_the_warm_up_and_render(tmp_path):
    argv = ["--smoke", "--seeds", "0", "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]
    assert tb.main([*argv, "--part", "1/2"]) == 0  # rows "none" and "oracle": the warm-up is run for them
    units = tmp_path / "threebody_recipe_units" / "cpu_smoke"
    assert json.loads((units / "part1of2.json").read_text())["points"][0]["stage"] == "none"
    assert tb.main([*argv, "--part", "0/2"]) == 0  # the warm-up unit (only loaded now) and the learned row
    md = (tmp_path / "threebody_recipe_smoke.md").read_text()
    assert "Units: 4 of 4 done." in md and "| HNN + SE(2) oracle | 0 |" in md
    assert md.rstrip().endswith(
        "the criteria are read when all are.\n- The units left and the command that continues them are listed above."
    )
    assert re.search(r"\*\*Not run\*\* \(4 of 4 units done\)", md)
    points = json.loads((tmp_path / "threebody_recipe_smoke.json").read_text())["points"]
    learned = next(p for p in points if p["stage"] == "learned")
    for key in ("discovery", "discovery_start"):
        d = learned["analysis"][key]
        assert 0 <= d["flow_share"] <= 1 and 0 <= d["new_share"] <= 1 and d["rtol"] == 0.1
    warm = next(p for p in points if p["stage"] == "warmup")
    assert warm["steps_timed"] == tb.SMOKE["warmup"]["steps"]  # run once, by the part that needed it


def test_committed_table_verdict_is_the_scripts_reading_of_its_units():
    cfg = tb.PRESETS["cpu"]
    units = common.RESULTS_DIR / "threebody_recipe_units" / "cpu"
    keys = tb.unit_keys([0, 1, 2], list(tb.SYMMETRY))
    points = common.unit_points(sorted(units.glob("part*.json")), keys, tb.key_of, partial=True)
    md = tb.markdown(cfg, "--preset cpu", points, keys, units, {})
    committed = (common.RESULTS_DIR / "threebody_recipe.md").read_text()
    assert committed[committed.index("## Verdict") :].rstrip() == md[md.index("## Verdict") :].rstrip()
    assert (
        committed[committed.index("Units:") : committed.index("## Criteria")]
        == md[md.index("Units:") : md.index("## Criteria")]
    )


def test_gpu_preset_runs_at_toy_size_on_the_cpu(tmp_path):
    argv = ["--preset", "gpu", "--smoke", "--device", "cpu", "--seeds", "0", "--rows", "learned"]
    assert tb.main([*argv, "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 0
    payload = json.loads((tmp_path / "threebody_recipe_gpu_smoke.json").read_text())
    assert payload["settings"]["model"]["hidden"] == [250] * 4 and len(payload["points"]) == 2
    assert "--preset gpu --smoke" in (tmp_path / "threebody_recipe_gpu_smoke.md").read_text()
