"""``benchmarks/timing.py``: every section at ``--smoke`` size writes its result file with the header that names
path, mode and device; the GPU section's smoke run records every variant and renders the speed table from its
result file (``--render-speed``)."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import timing
import torch

STEMS = {
    "step": "step_time",
    "gpu": "gpu_step_time_cpu",
    "layerwise": "layerwise_step_time",
    "noether-flow": "noether_flow_step_time",
    "transform-path": "transform_path",
    "kfac": "kfac_update_cost",
    "guides": "guide_cost",
    "ddp": "ddp_throughput",
    "particles": "hnn_particles",
    "determinism": "gpu_determinism",
    "import": "import_time",
}


def test_every_section_has_a_result_stem():
    assert set(STEMS) == set(timing.SECTIONS)


@pytest.mark.parametrize("section", [s for s in STEMS if s != "gpu"])  # gpu: its own test below
def test_smoke_run_writes_its_result_file(section, tmp_path):
    assert timing.main(["--section", section, "--smoke", "--out-dir", str(tmp_path)]) == 0
    md = (tmp_path / f"{STEMS[section]}_smoke.md").read_text()
    payload = json.loads((tmp_path / f"{STEMS[section]}_smoke.json").read_text())
    for line in (f"- result file: `{tmp_path / STEMS[section]}_smoke.md`", "- mode: `smoke`", "- device: `cpu`"):
        assert line in md
    assert payload["settings"]["mode"] == "smoke" and "machine" in payload and "command" in payload
    assert not re.search(r"\bnan\b", md.split("Settings:")[-1])  # every timed number came out
    if section == "step":  # the hand-written twin computes Pyro's loss and gradients from the same parameters and seed
        check = payload["results"]["activations"]["rff"]["fit"]["check"]
        assert check["loss_rel_diff"] < 1e-5
        assert all(v < 1e-4 for k, v in check.items() if k.startswith("grad_rel_diff"))


GPU_SMOKE = [
    *("--section gpu --smoke --repeats 2 --compile-modes capture,cudagraphs --models layerwise-conv".split()),
    *("--parts mlp-overhead,layerwise,hnn-3body,reference --layerwise-variants fit".split()),
]


def test_gpu_smoke_records_every_variant_and_renders_the_speed_table(tmp_path):
    """The GPU section at toy size on a CPU: each compile mode of ours against the twin given the same treatment
    (CUDA graphs: skipped with the reason on a CPU), per-variant path / compile / steps, the load around each part,
    repetitions with their median ratio, the 3-body part at the reference's batch with the prior update, and the
    speed table rendered from the result file alone, with no ratio against the plain (old) Pyro loop."""
    assert timing.main([*GPU_SMOKE, "--out-dir", str(tmp_path)]) == 0
    md = (tmp_path / "gpu_step_time_cpu_smoke.md").read_text()
    results = json.loads((tmp_path / "gpu_step_time_cpu_smoke.json").read_text())["results"]
    assert "- mode: `smoke`" in md and "- device: `cpu`" in md
    runs = results["mlp-overhead"]["activations"]["rff"]
    assert list(runs) == ["fit", "fit-capture", "fit-cudagraphs"]
    for name, run in runs.items():
        assert len(run["reps"]) == 2
        for entry in run["reps"]:
            assert entry["variants"]["fit"]["path"] in ("weights", "inputs") and entry["steps"] == 2
            assert entry["compile"] == ("default" if name == "fit" else name.removeprefix("fit-"))
            assert entry["warmup"] == 1
            assert "pyro" not in entry["times"]  # the old loop is not timed against
    assert runs["fit"]["ratio"] == statistics.median(runs["fit"]["ratio_per_repetition"])
    assert runs["fit-capture"]["reps"][0]["variants"]["twin"]["kind"] == "eager"
    graphed = runs["fit-cudagraphs"]["reps"][0]["variants"]["twin"]
    assert (
        graphed["kind"] == "graphed" and "CUDA device" in graphed["skipped"] and runs["fit-cudagraphs"]["ratio"] is None
    )
    for part in ("mlp-overhead", "layerwise", "hnn-3body", "reference"):
        meta = results["meta"][part]
        assert meta["interval"][0] <= meta["interval"][1] and "load_1min" in meta["load_after"]
    assert results["meta"]["reference"]["background"] and "skipped" in results["reference"]
    body = results["hnn-3body"]
    assert (
        body["settings"]["prior"].startswith("closed-form")
        and body["settings"]["batch"] <= body["settings"]["num_data"]
    )
    rows = {(r["variant"]): r for r in results["layerwise"]["rows"]}
    assert rows["fit"]["strided"] is not None and rows["fit"]["twins"]["twin"]["kind"] == "eager"
    assert timing.main(["--section", "gpu", "--render-speed", str(tmp_path), "--out-dir", str(tmp_path)]) == 0
    table = (tmp_path / "speed_table.md").read_text()
    assert timing.SPEED_HEADER in table and "`fit-capture` (" in table and "plain strided CNN" in table
    assert f"{runs['fit']['ratio']:.2f}× (paired, median of 2)" in table
    assert "gpu_step_time_cpu_smoke.json" in table and "overlap with the JAX reference" in table
    assert "Pyro" not in table.split("What else ran")[0]


def test_the_twin_of_each_compile_mode(monkeypatch):
    """inductor: the twin's loss compiled with fit's backend, stepped once before timing; cudagraphs on a CPU:
    no twin, and why; minibatch indices on the device, copied once per pass."""
    monkeypatch.setattr(timing.CapturedLoss, "backend", "aot_eager")  # the same path as inductor, fast
    cfg, device = timing.MLP_SIZES["smoke"], torch.device("cpu")
    case = timing.mlp_case(cfg, "rff", 0)
    twin = timing.InvariantMLPTwin(case["model"], case["guide"])
    groups = twin.param_groups(timing.pi.FitConfig())
    before = twin.w2_loc.detach().clone()
    step, info = timing.twin_for("inductor", twin.loss, groups, case, 10, 0, device)
    assert step is not None and info["kind"] == "compiled" and info["compile_seconds"] > 0
    assert not torch.equal(before, twin.w2_loc.detach())  # the untimed first step ran
    step()
    none, why = timing.twin_for("cudagraphs", twin.loss, groups, case, 10, 0, device)
    assert none is None and "CUDA device" in why["skipped"]
    rows = timing.Shuffler(10, 4, 0, device)
    seen = torch.cat([rows.next(), rows.next()])
    assert len(set(seen.tolist())) == 8 and rows.next().device == device
