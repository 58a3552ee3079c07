"""``benchmarks/timing.py``: every section at ``--smoke`` size writes its result file with the header that names
path, mode and device; ``--section gpu --rerender`` redraws a GPU session's tables from its JSON and joins the JAX
reference of the same session (the SHO criterion is a ratio between two parts of one session)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import timing

RUN = Path(timing.__file__).resolve().parent / "results" / "gpu_step_time_cuda_run3"
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


@pytest.mark.parametrize("section", list(STEMS))
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


def test_rerender_joins_the_reference_of_the_same_session(tmp_path):
    sho, reference = RUN / "gpu_step_time_cuda_sho_alone.json", RUN / "gpu_step_time_cuda_reference_sho.json"
    assert timing.main(["--section", "gpu", "--rerender", str(sho), "--out-dir", str(tmp_path)]) == 0
    assert "JAX reference" not in (tmp_path / sho.with_suffix(".md").name).read_text()
    argv = ["--section", "gpu", "--rerender", str(sho), "--with-reference", str(reference), "--out-dir", str(tmp_path)]
    assert timing.main(argv) == 0
    joined = (tmp_path / sho.with_suffix(".md").name).read_text()
    ref_s = json.loads(reference.read_text())["results"]["reference"]["hnn-sho"]["s_per_step"]
    payload = json.loads(sho.read_text())
    ours = payload["results"]["hnn-sho"]["particles"]["20"]["stats"]["fit"]["median"]
    line = next(v for v in joined.splitlines() if v.startswith("- hnn-sho, 20 weight sample(s): fit / JAX reference"))
    assert f"({ref_s * 1e3:.1f} ms" in line and f"= {ours / ref_s:.2f}×" in line
    assert ("met" if ours / ref_s <= 0.5 else "not met") == line.rsplit(": ", 1)[-1].rstrip(".")
    assert reference.name in joined  # where the reference came from is named
    assert json.loads((tmp_path / sho.name).read_text()) == payload  # the JSON is written unchanged


def test_rerender_names_the_gpu_session_part(tmp_path):
    src = RUN / "gpu_step_time_cuda_3body.json"
    assert timing.main(["--section", "gpu", "--rerender", str(src), "--out-dir", str(tmp_path)]) == 0
    md = (tmp_path / src.with_suffix(".md").name).read_text()
    assert "bash benchmarks/gpu_session.sh   # part '3body'" in md
    assert "## Symmetrised HNN, 3body" in md and "`before`" in md  # the old session's variants are drawn
