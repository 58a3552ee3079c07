"""``benchmarks/gpu_step_time.py --rerender``: the tables of a GPU session's JSON re-rendered here, the
JAX reference of the same session joined with ``--with-reference`` (issue 14's SHO criterion is a
ratio between two parts of one session)."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import BENCHMARKS, load_benchmark

RUN = BENCHMARKS / "results" / "gpu_step_time_cuda_run3"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gpu_step_time")


def test_rerender_joins_the_reference_of_the_same_session(bench, tmp_path):
    sho, reference = RUN / "gpu_step_time_cuda_sho_alone.json", RUN / "gpu_step_time_cuda_reference_sho.json"
    assert bench.main(["--rerender", str(sho), "--out-dir", str(tmp_path)]) == 0
    alone = (tmp_path / sho.with_suffix(".md").name).read_text()
    assert "JAX reference" not in alone
    assert bench.main(["--rerender", str(sho), "--with-reference", str(reference), "--out-dir", str(tmp_path)]) == 0
    joined = (tmp_path / sho.with_suffix(".md").name).read_text()
    ref_s = json.loads(reference.read_text())["results"]["reference"]["hnn-sho"]["s_per_step"]
    payload = json.loads(sho.read_text())
    ours = payload["results"]["hnn-sho"]["particles"]["20"]["stats"]["fit"]["median"]
    line = next(v for v in joined.splitlines() if v.startswith("- hnn-sho, 20 weight sample(s): fit / JAX reference"))
    assert f"({ref_s * 1e3:.1f} ms" in line and f"= {ours / ref_s:.2f}×" in line
    assert ("met" if ours / ref_s <= 0.5 else "not met") == line.rsplit(": ", 1)[-1].rstrip(".")
    assert reference.name in joined  # where the reference came from is named
    assert json.loads((tmp_path / sho.name).read_text()) == payload  # the JSON is written unchanged


def test_rerender_names_the_gpu_session_part(bench, tmp_path):
    src = RUN / "gpu_step_time_cuda_3body.json"
    assert bench.main(["--rerender", str(src), "--out-dir", str(tmp_path)]) == 0
    md = (tmp_path / src.with_suffix(".md").name).read_text()
    assert "bash benchmarks/gpu_session.sh   # part '3body'" in md
    assert md == (RUN / src.with_suffix(".md").name).read_text()  # the committed table is this rendering
