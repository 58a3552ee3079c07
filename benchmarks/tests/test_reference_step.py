"""``benchmarks/reference_step.py``: the JAX reference's settings read from its own command line, compared with our
side's (``timing.HNN``), and the JSON line it prints. Without JAX or a checkout of the reference (CI has neither) the
parts that need neither run against a stand-in ``main.py`` holding the reference's flags and defaults; the timed
step itself runs where a checkout (``$NOETHERS_RAZOR``, else ``.gpu/noethers-razor``) and a Python with JAX
(``$REFERENCE_PYTHON``, else this one) are present."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import reference_step as rs
import timing

#: the reference's flags that its timed command lines rely on, with the reference's types and defaults
FLAGS = {
    "--dynamics": (str, "nbody_2d_3b"),
    "--group": (str, ""),
    "--seed": (int, 100),
    "--train_size": (int, 100),
    "--train_steps": (int, 10),
    "--stepsize": (float, 0.1),
    "--n_hidden": (int, 200),
    "--n_layers": (int, 3),
    "--act_fun": (str, "elu2"),
    "--fixed_basis_scale": (float, 1.0),
    "--basis_prec": (float, 1.0),
    "--n_epochs": (int, 1000),
    "--scheduler": (str, "cosine"),
    "--n_burnin": (int, 20),
    "--batch_size": (int, -1),
    "--lr_param": (float, 0.001),
    "--lr_hyper": (float, 0.1),
    "--lr_cyper": (float, 0.01),
    "--steps": (int, 10),
    "--output_var": (float, 0.001),
    "--output_noise": (float, 0.001),
    "--init_prior_var": (float, 1.0),
    "--measure_dist": (str, "uniform"),
    "--measure_scale": (float, 1.0),
    "--sym_steps": (int, 20),
    "--bch_order": (int, 1),
    "--sym_samples": (int, 16),
    "--mc_samples": (int, 20),
    "--output_var_method": (str, "fixed"),
    "--prior_prec_method": (str, "gradients"),
    "--init_posterior_scale": (float, 10.0),
    "--conserved_init_std": (float, 0.0),
    "--multisteps": (int, 1),
}
SWITCHES = ("--fixed_basis", "--canonicalise", "--vi", "--map_mean", "--sym_over_path", "--residual")
SIZES = ("state dimension", "hidden widths", "(x, y) pairs", "Euler", "dt", "weight samples", "symmetry samples")
SIZES += ("generators", "symmetry sampling")


@pytest.fixture
def main_py(tmp_path: Path) -> Path:
    """A stand-in for the reference's ``main.py``: its argument parser only, in the reference's own form."""
    lines = ["import argparse", "", "if __name__ == '__main__':", "    parser = argparse.ArgumentParser('x')"]
    lines += [f"    parser.add_argument('{f}', type={t.__name__}, default={d!r})" for f, (t, d) in FLAGS.items()]
    lines += [f"    parser.add_argument('{f}', action='store_true')" for f in SWITCHES]
    path = tmp_path / "main.py"
    path.write_text("\n".join([*lines, "    args = parser.parse_args()", ""]))
    return path


def settings(main_py: Path, system: str, variant: str, smoke: bool = False) -> dict:
    return rs.settings_of(rs.reference_namespace(main_py, rs.reference_argv(system, variant, smoke)))


def test_the_reference_parser_keeps_its_defaults_and_types(main_py):
    ns = rs.reference_parser(main_py).parse_args(["--steps", "20", "--vi"])
    assert ns.steps == 20 and ns.vi and not ns.residual and ns.stepsize == 0.1 and ns.group == ""
    assert isinstance(rs.reference_parser(main_py).parse_args(["--stepsize", "1"]).stepsize, float)


def test_settings_of_the_two_systems(main_py):
    sho, body = settings(main_py, "hnn-sho", "learned"), settings(main_py, "hnn-3body", "learned")
    assert (sho["pairs_per_step"], sho["sym_samples"], sho["euler_steps"], sho["mc_samples"]) == (28, 200, 20, 20)
    assert (sho["hidden"], sho["num_generators"], sho["state_dim"], sho["dt"]) == ([200, 200], 1, 2, 0.2)
    # the 3-body batch counts trajectories: 20 × 50 steps; E is the reference's default (10)
    assert (body["pairs_per_step"], body["dataset_pairs"], body["batches_per_epoch"]) == (1000, 10000, 10)
    assert (body["sym_samples"], body["euler_steps"], body["num_generators"], body["state_dim"]) == (100, 10, 10, 12)
    assert body["hidden"] == [250, 250, 250] and body["prior_prec_method"] == "empirical"
    plain = settings(main_py, "hnn-sho", "plain")
    assert plain["group"].startswith("none") and plain["sym_samples"] == 0 and plain["lr_cyper"] == 0.0
    assert settings(main_py, "hnn-sho", "learned", smoke=True)["hidden"] == [8, 8]


def test_unsupported_reference_runs_are_refused(main_py):
    with pytest.raises(ValueError, match="--residual"):
        rs.reference_namespace(main_py, [*rs.reference_argv("hnn-sho", "learned"), "--residual"])
    with pytest.raises(ValueError, match="unknown system"):
        rs.reference_argv("kepler", "learned")


@pytest.mark.parametrize("system", list(rs.REFERENCE_ARGS))
@pytest.mark.parametrize("variant", rs.VARIANTS)
def test_our_side_runs_at_the_reference_sizes(main_py, system, variant):
    ours = timing.HNN[system]
    found = rs.compare_settings(ours, settings(main_py, system, variant), variant)
    assert [m for m in found if m.startswith(SIZES)] == []


def test_compare_settings_names_each_difference(main_py):
    ref = settings(main_py, "hnn-3body", "learned")
    ours = {**timing.HNN["hnn-3body"], "batch": 20, "particles": (1,), "elu_alpha": 2.0}
    found = rs.compare_settings(ours, ref, "learned")
    assert "(x, y) pairs per step: ours 20, reference 1000" in found
    assert "weight samples: ours (1,), reference 2" in found and "ELU α: ours 2.0, reference 1.0" in found


def test_record_is_the_json_contract():
    line = json.loads(json.dumps(rs.record([0.3, 0.1, 0.2], 4.0, 1.5, {"a": 1}, system="hnn-sho", devices=["cpu:0"])))
    assert line["median_s"] == 0.2 and line["step_s"] == [0.3, 0.1, 0.2] and line["timed_steps"] == 3
    assert line["compile_s"] == 4.0 and line["settings"] == {"a": 1} and line["devices"] == ["cpu:0"]


def test_dry_run_prints_the_settings_without_jax(main_py):
    lines = []
    argv = ["--reference-dir", str(main_py.parent), "--system", "hnn-3body", "--variant", "plain", "--dry-run"]
    assert rs.main(argv, out=lines.append) == 0
    line = json.loads(lines[0])
    assert line["variant"] == "plain" and line["settings"]["pairs_per_step"] == 1000
    assert "--group" not in line["reference_argv"]


def test_run_reference_without_a_checkout_says_why(tmp_path):
    args = argparse.Namespace(reference_dir=None, mode="smoke", device="cpu")
    assert "no --reference-dir" in timing.run_reference(args)["skipped"]
    args.reference_dir = tmp_path
    assert "skipped" in timing.run_reference(args)


def _reference_python() -> str | None:
    if python := os.environ.get("REFERENCE_PYTHON"):
        return python
    return sys.executable if importlib.util.find_spec("jax") else None


CHECKOUT = Path(os.environ.get("NOETHERS_RAZOR", Path(rs.__file__).resolve().parents[1] / ".gpu" / "noethers-razor"))


@pytest.mark.skipif(not (CHECKOUT / "train.py").exists(), reason=f"no checkout of the reference at {CHECKOUT}")
@pytest.mark.skipif(_reference_python() is None, reason="no JAX here (set REFERENCE_PYTHON to a Python with JAX)")
def test_smoke_step_is_timed_on_the_reference():
    cmd = [_reference_python(), rs.__file__, "--reference-dir", str(CHECKOUT), "--variant", "plain", "--smoke"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([*cmd, "--steps", "2"], capture_output=True, text=True, env=env, timeout=600, check=True)
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["timed_steps"] == 2 and line["backend"] == "cpu" and line["devices"]
    assert line["compile_s"] > 0 and all(t > 0 for t in line["step_s"]) and line["final_loss"] == line["final_loss"]


FAKE_REFERENCE = """
import argparse, json, sys, time
from pathlib import Path
p = argparse.ArgumentParser()
for name in ("--reference-dir", "--system", "--variant", "--warmup", "--steps", "--ready-file", "--go-file"):
    p.add_argument(name)
p.add_argument("--smoke", action="store_true")
a = p.parse_args()
log = Path(a.reference_dir) / "log.txt"
time.sleep(0.3)  # "compiling"
Path(a.ready_file).touch()
while not Path(a.go_file).exists():
    time.sleep(0.05)
with log.open("a") as f:
    f.write(f"start {a.variant} {time.time()}\\n")
time.sleep(0.3)  # "the timed steps"
with log.open("a") as f:
    f.write(f"end {a.variant} {time.time()}\\n")
print(json.dumps({"median_s": 0.01, "compile_s": 0.3, "settings": {}, "step_s": [0.01]}))
"""


def test_the_reference_compiles_at_once_then_times_each_variant_alone_after_the_go_file(tmp_path, monkeypatch):
    """Every variant compiles in parallel; none steps before ``--reference-go`` exists; then one at a time."""
    (tmp_path / "main.py").write_text("")
    fake = tmp_path / "fake_reference.py"
    fake.write_text(FAKE_REFERENCE)
    monkeypatch.setattr(timing, "REFERENCE_SCRIPT", fake)
    go = tmp_path / "go"
    args = argparse.Namespace(
        reference_dir=tmp_path, mode="smoke", device="cpu", threads=1, reference_systems=["hnn-sho"],
        parts=["reference"], warmup=None, steps=None, reference_go=go,
    )  # fmt: skip
    released = time.time() + 1.5
    threading.Timer(1.5, go.touch).start()
    out = timing.run_reference(args)
    assert set(out) == {"hnn-sho", "hnn-sho-plain"} and all(e["s_per_step"] == 0.01 for e in out.values())
    events = [line.split() for line in (tmp_path / "log.txt").read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # one variant at a time
    assert float(events[0][2]) >= released - 0.05  # no step before the go file
