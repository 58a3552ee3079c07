"""Data-parallel runs end like one-process runs (``docs/scale_out.md``, "More than one GPU or machine"): one message
(rank 0), exit 130 / 143 under ``python -m pyro_invariance.launch``, a resume hint that names the
shards, every failing rank's reason in torchrun's failure summary, no lock file left behind, and a
``result.json`` that lists the plots written.

Two tests start 2 CPU ranks (``gloo``); the rest check the same endings in this process, with the
environment torchrun gives its workers and torch's own parser of their error files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import pyro_invariance.cli as cli
import pyro_invariance.launch as launch
from pyro_invariance.cli import main
from pyro_invariance.infer.checkpoint import load_checkpoint
from pyro_invariance.infer.interrupts import FitInterrupted
from pyro_invariance.infer.runlock import RunLock

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "fit",
    "--model",
    "invariant-mlp",
    "--data",
    "digits",
    "--model-arg",
    "hidden=16",
    "--model-arg",
    "num_transforms=4",
    "--train-size",
    "128",
    "--test-size",
    "32",
    "--no-progress",
    "--eval-samples",
    "2",
]
DDP = ["--strategy", "ddp", "--shards", "2", "--log-every", "2"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _messages(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("pyro-invariance:")]


# --------------------------------------------------------------------------------------------
# 2 ranks
# --------------------------------------------------------------------------------------------


def test_ctrl_c_on_two_ranks_ends_with_one_message_and_exit_130(tmp_path):
    """SIGINT to the launcher: the ranks stop together with a checkpoint; rank 0 alone says where,
    and how to resume (in one process too: ``--shards 2``); exit 130, no traceback, no lock file."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "pyro_invariance.launch",
        "--standalone",
        "--nproc-per-node",
        "2",
        *SMALL,
        *DDP,
        "--steps",
        "2000",
        "--checkpoint-every",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (out / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < 240
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert code == 130, err
    assert "Traceback" not in err and "SignalException" not in err
    (line,) = _messages(err)
    assert line.startswith("pyro-invariance: interrupted at step ") and str(out / "checkpoint.pt") in line
    assert "or in one process with --resume --shards 2 (without --strategy ddp)" in line
    step = int(line.split("interrupted at step ")[1].split(";")[0])
    assert load_checkpoint(out / "checkpoint.pt")["step"] == step < 2000
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]  # no lock file naming a dead process


def test_a_refused_run_under_torchrun_names_its_reason_in_the_root_cause(tmp_path):
    """Plain torchrun keeps its own summary and exit code; the summary's Root Cause now holds the
    reason, rank 0 prints it once, and the refused folder keeps no lock file."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text("{}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "pyro_invariance.cli",
        *SMALL,
        *DDP,
        "--steps",
        "4",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]  # torchrun's own code for a failed worker
    reason = f"pyro-invariance: error: --out {str(out)!r} already holds result.json"
    assert _messages(done.stderr)[0].startswith(reason) and len(_messages(done.stderr)) == 1
    root = done.stderr.split("Root Cause (first observed failure):")[1]  # rank 0's, or rank 1's naming rank 0's
    assert "traceback : pyro-invariance: error: " in root and f"--out {str(out)!r} already holds result.json" in root
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]


# --------------------------------------------------------------------------------------------
# The same endings, in this process
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_launcher_exits_as_the_cli_does_when_torchrun_is_signalled(monkeypatch, capsys, sig):
    def signalled(args):
        assert args.module and args.training_script == "pyro_invariance.cli"
        assert args.training_script_args[:2] == ["fit", "--out"]
        raise SignalException(f"Process 1 got signal: {sig}", sigval=signal.Signals(sig))

    monkeypatch.setattr(launch.torchrun, "run", signalled)
    assert launch.main(["--nproc-per-node", "2", "fit", "--out", "x"]) == 128 + sig
    assert capsys.readouterr().err == ""  # rank 0 has said where the run stopped


def _failure(tmp_path: Path, rank: int, exitcode: int, message: str | None) -> ProcessFailure:
    path = tmp_path / f"error-{rank}.json"
    if message is not None:
        path.write_text(
            json.dumps({"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}}})
        )
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(path))


def test_the_launcher_reports_a_failure_rank_0_did_not_print(monkeypatch, capsys, tmp_path):
    def failed(args):
        raise ChildFailedError(
            "pyro_invariance.cli", {1: _failure(tmp_path, 1, -9, None), 0: _failure(tmp_path, 0, -15, None)}
        )

    monkeypatch.setattr(launch.torchrun, "run", failed)
    assert launch.main(["--nproc-per-node", "2", "fit"]) == 128 + 9
    assert capsys.readouterr().err.strip() == "pyro-invariance: rank 1: killed by SIGKILL"
    # rank 0 printed its own reason: the launcher adds nothing, and exits with its code
    failure = {0: _failure(tmp_path, 0, 2, "pyro-invariance: error: x")}
    monkeypatch.setattr(launch.torchrun, "run", lambda args: (_ for _ in ()).throw(ChildFailedError("cli", failure)))
    assert launch.main(["--nproc-per-node", "2", "fit"]) == 2
    assert capsys.readouterr().err == ""


#: torch's record(), which main runs under torchrun, points faulthandler at stderr: capsys's has no file descriptor
no_fault_handler = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")


def _as_torchrun_worker(monkeypatch, tmp_path: Path, rank: int) -> Path:
    error_file = tmp_path / f"error-{rank}.json"
    for key, value in {"TORCHELASTIC_ERROR_FILE": str(error_file), "RANK": str(rank), "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    return error_file


@no_fault_handler
@pytest.mark.parametrize("rank", [0, 1])
def test_an_error_is_recorded_for_torchruns_summary_and_printed_by_rank_0(monkeypatch, capsys, tmp_path, rank):
    error_file = _as_torchrun_worker(monkeypatch, tmp_path, rank)
    assert main([*SMALL, "--model-arg", "hidden=[16,", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    reason = "pyro-invariance: error: --model-arg: 'hidden=[16,' is not valid JSON"
    assert err.startswith(reason) if rank == 0 else err == ""  # rank 1: the summary shows it
    summary = str(ChildFailedError("pyro_invariance.cli", {rank: ProcessFailure(rank, 1, 2, str(error_file))}))
    assert f"traceback : {reason}" in summary.split("Root Cause")[1]


@no_fault_handler
def test_an_uncaught_error_under_torchrun_reaches_the_summary_with_its_traceback(monkeypatch, tmp_path):
    error_file = _as_torchrun_worker(monkeypatch, tmp_path, 0)
    with pytest.raises(ValueError):
        main(["--traceback", *SMALL, "--model-arg", "hidden=[16,", "--out", str(tmp_path / "o")])
    recorded = json.loads(error_file.read_text())["message"]
    assert (
        recorded["message"].startswith("ValueError: --model-arg")
        and "Traceback" in recorded["extraInfo"]["py_callstack"]
    )


@pytest.mark.parametrize(
    "extra, hint",
    [
        (["--shards", "2"], "; continue with --resume --shards 2"),
        (
            ["--shards", "4", "--strategy", "ddp"],
            "; continue with the same command and --resume, "
            "or in one process with --resume --shards 4 (without --strategy ddp)",
        ),
    ],
)
def test_the_resume_hint_names_the_shards_a_resume_needs(monkeypatch, capsys, tmp_path, extra, hint):
    def interrupted(spec, out, *args, **kw):
        raise FitInterrupted(7, out / "checkpoint.pt", signal.SIGTERM)

    monkeypatch.setattr(cli, "run_fit", interrupted)
    assert main([*SMALL, *extra, "--out", str(tmp_path / "o")]) == 143
    line = capsys.readouterr().err.strip()
    assert line == f"pyro-invariance: interrupted at step 7; checkpoint at {tmp_path / 'o' / 'checkpoint.pt'}{hint}"


@no_fault_handler
def test_an_interrupt_is_printed_by_rank_0_only(monkeypatch, capsys, tmp_path):
    _as_torchrun_worker(monkeypatch, tmp_path, 1)
    monkeypatch.setattr(cli, "run_fit", lambda spec, out, *a, **k: (_ for _ in ()).throw(FitInterrupted(7, out, 2)))
    assert main([*SMALL, "--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------------------------
# What a run leaves in its folder (one process and data-parallel share this code)
# --------------------------------------------------------------------------------------------


def test_a_finished_run_lists_its_plots_and_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    assert main([*SMALL, "--steps", "2", "--out", str(out)]) == 0
    plots = json.loads((out / "result.json").read_text())["summary"]["plots"]
    assert sorted(Path(p).name for p in plots) == ["eta.png", "filters.png", "orbits.png"]
    assert all(Path(p).is_file() for p in plots)
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt",
        "eta.png",
        "filters.png",
        "orbits.png",
        "result.json",
    ]


def test_a_refused_run_leaves_no_lock(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text("{}")
    assert main([*SMALL, "--steps", "2", "--out", str(out)]) == 2
    assert "already holds result.json" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]


def test_the_lock_file_goes_with_its_holder(tmp_path):
    with RunLock(tmp_path / "c.pt") as lock:
        assert lock.lock_path.read_text() == str(os.getpid())
    assert not lock.lock_path.exists()


def test_a_writer_that_locked_a_removed_lock_file_locks_the_new_one(tmp_path, monkeypatch):
    """Between a writer's open and its flock, the holder removes the file and a third writer creates
    the next one: the writer must not hold the removed file (two writers would each think they hold
    the run), but the file the path names."""
    fcntl = pytest.importorskip("fcntl")
    lock_path = tmp_path / "c.pt.lock"
    real_flock, raced = fcntl.flock, []

    def flock(fd, operation):
        if operation & fcntl.LOCK_EX and not raced:
            raced.append(fd)
            lock_path.unlink()
            lock_path.touch()
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    with RunLock(tmp_path / "c.pt"):
        assert raced and lock_path.read_text() == str(os.getpid())
        other = os.open(lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # the file at the path is held
                real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
