"""The ``pyro-invariance`` command line: list, fit, evaluate, resume, demo, clear errors."""

import json
import math
import subprocess
import sys

import pytest
import torch

from pyro_invariance.cli import _parse_kv, main

torch.set_num_threads(1)

SMALL = [
    "--model-arg",
    "hidden=16",
    "--model-arg",
    "num_transforms=4",
    "--train-size",
    "200",
    "--test-size",
    "50",
    "--no-progress",
    "--eval-samples",
    "2",
]


def test_list_shows_models_guides_datasets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "invariant-mlp",
        "basis-regression",
        "block-cholesky",
        "matrix-normal",
        "mean-field",
        "rotated-digits",
        "fashion-mnist",
    ):
        assert name in out
    assert main(["list", "guides"]) == 0
    assert "invariant-mlp" not in capsys.readouterr().out


def test_fit_writes_result_checkpoint_plots_and_evaluate_reads_them(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "fit",
            "--model",
            "invariant-mlp",
            "--guide",
            "mean-field",
            "--data",
            "rotated-digits",
            "--steps",
            "6",
            "--out",
            str(out),
            *SMALL,
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "test acc" in printed and "rot=" in printed
    payload = json.loads((out / "result.json").read_text())
    assert payload["config"]["steps"] == 6 and len(payload["history"]["elbo"]) == 6
    assert 0.0 <= payload["summary"]["metrics"]["accuracy"] <= 1.0
    for name in ("checkpoint.pt", "eta.png", "filters.png", "orbits.png"):
        assert (out / name).stat().st_size > 0
    assert main(["evaluate", "--run", str(out), "--eval-samples", "2"]) == 0
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["model"] == "invariant-mlp" and "accuracy" in evaluation["metrics"]


def test_fit_resume_continues_the_run(tmp_path):
    out = tmp_path / "run"
    args = ["fit", "--model", "invariant-mlp", "--data", "digits", "--out", str(out), *SMALL]
    assert main([*args, "--steps", "8"]) == 0
    straight = json.loads((out / "result.json").read_text())["history"]["elbo"]
    # a second run that checkpoints every 3 steps, then resumes from its own final checkpoint
    out2 = tmp_path / "run2"
    args2 = ["fit", "--model", "invariant-mlp", "--data", "digits", "--out", str(out2), *SMALL]
    assert main([*args2, "--steps", "8", "--checkpoint-every", "3"]) == 0
    assert main([*args2, "--steps", "8", "--resume"]) == 0  # nothing left to do: same history
    assert json.loads((out2 / "result.json").read_text())["history"]["elbo"] == straight


@pytest.mark.parametrize(
    "args, message",
    [
        (["fit", "--model", "nope", "--data", "digits"], "unknown model 'nope'"),
        (["fit", "--model", "invariant-mlp", "--guide", "nope", "--data", "digits"], "unknown guide 'nope'"),
        (["fit", "--model", "invariant-mlp", "--data", "rotated-nope"], "unknown dataset 'rotated-nope'"),
        (["fit", "--model", "invariant-mlp", "--data", "digits", "--steps", "-1"], "steps must be"),
        (["fit", "--model", "invariant-mlp", "--data", "digits", "--model-arg", "num_transforms=-2"], "num_transforms"),
        (["fit", "--model", "invariant-mlp", "--data", "digits", "--model-arg", "symmetry=spin"], "unknown symmetry"),
        (
            ["fit", "--model", "invariant-mlp", "--data", "fashion-mnist", "--data-dir", "/nonexistent"],
            "apt-get install",
        ),
        (["evaluate", "--run", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_input_gives_clear_error(tmp_path, capsys, args, message):
    code = main([*args, *(["--out", str(tmp_path / "o"), "--no-progress"] if args[0] == "fit" else [])])
    assert code == 2
    assert message in capsys.readouterr().err


def test_corrupt_checkpoint_on_evaluate(tmp_path, capsys):
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    assert main(["evaluate", "--run", str(tmp_path)]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_parse_key_values():
    assert _parse_kv(["a=1", "b=rotation", "c=[1, 8, 8]", "learn-symmetry=false"]) == {
        "a": 1,
        "b": "rotation",
        "c": [1, 8, 8],
        "learn_symmetry": False,
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _parse_kv(["oops"])


def test_console_script_demo_runs(tmp_path):
    """The installed entry point runs the main job end to end (tiny number of steps)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyro_invariance.cli",
            "demo",
            "--steps",
            "5",
            "--threads",
            "1",
            "--out",
            str(tmp_path / "demo"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "learned rotation" in proc.stdout and "no invariance" in proc.stdout
    assert "learned η_rot" in proc.stdout
    assert (tmp_path / "demo" / "eta_and_elbo.png").exists()


def test_fit_and_evaluate_symmetrised_hnn_on_physics_data(tmp_path, capsys):
    out = tmp_path / "hnn"
    args = [
        "fit",
        "--model",
        "symmetrised-hnn",
        "--guide",
        "matrix-normal",
        "--data",
        "sho",
        "--steps",
        "4",
        "--batch-size",
        "28",
        "--out",
        str(out),
        "--no-progress",
        "--eval-samples",
        "2",
        "--model-arg",
        "hidden=[8,8]",
        "--model-arg",
        "num_transforms=2",
        "--model-arg",
        "euler_steps=2",
        "--data-arg",
        f"cache_dir={json.dumps(str(tmp_path / 'cache'))}",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "test MSE" in printed and "G0=" in printed
    payload = json.loads((out / "result.json").read_text())
    assert payload["spec"]["model_kwargs"]["state_dim"] == 2  # filled in from the dataset
    assert main(["evaluate", "--run", str(out), "--eval-samples", "2"]) == 0
    assert "energy drift" in capsys.readouterr().out


@pytest.mark.parametrize("curvature", [[], ["--laplace-curvature", "diagonal", "--laplace-delta-update", "mackay"]])
def test_fit_with_the_laplace_objective_on_a_layerwise_model(tmp_path, capsys, curvature):
    out = tmp_path / "run"
    code = main(
        [
            "fit",
            "--model",
            "layerwise-fc+conv",
            "--objective",
            "laplace",
            "--data",
            "quadrant-digits",
            "--model-arg",
            "alpha=1",
            "--train-size",
            "200",
            "--test-size",
            "100",
            "--steps",
            "12",
            "--laplace-every",
            "4",
            "--laplace-warmup",
            "4",
            "--eval-samples",
            "1",
            "--out",
            str(out),
            "--no-progress",
            *curvature,
        ]
    )
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    summary = result["summary"]
    assert summary["guide"] == "map"
    assert result["spec"]["model_kwargs"]["prior"] == "fixed" and result["spec"]["objective"] == "laplace"
    assert [s for s, _ in summary["laplace_evidence_log"]] == [4, 8, 12]
    assert math.isfinite(summary["laplace_log_evidence_per_datum"])
    assert result["config"]["lr"] == 1e-2  # the model's fit_defaults
    assert any(v != 1.0 for v in summary["eta"].values())  # δ were set by the evidence
    assert main(["evaluate", "--run", str(out), "--eval-samples", "1"]) == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--guide", "mean-field"], "use --guide map"),
        (["--model-arg", 'prior="learned"'], "sets the precisions itself"),
        (["--laplace-every", "0"], "--laplace-every must be"),
    ],
)
def test_laplace_objective_bad_input(tmp_path, capsys, extra, message):
    code = main(
        [
            "fit",
            "--model",
            "layerwise-fc+conv",
            "--objective",
            "laplace",
            "--data",
            "quadrant-digits",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
            *extra,
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_deterministic_flag_switches_on_deterministic_algorithms(tmp_path):
    before = torch.are_deterministic_algorithms_enabled()
    try:
        code = main(
            [
                "fit",
                "--model",
                "invariant-mlp",
                "--data",
                "digits",
                "--deterministic",
                "--steps",
                "2",
                "--out",
                str(tmp_path / "o"),
                *SMALL,
            ]
        )
        assert code == 0
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)
