"""Runs you can trust: safe loading, integrity, no silent overwrite, one writer, clean divergence,
resume of exactly the same run, interrupts, and one-line CLI errors (``docs/reliability.md``)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from small_runs import fit_state, small_digits, small_fit, small_model

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.cli import main
from pyro_invariance.infer.checkpoint import CheckpointError, load_checkpoint, payload_digest
from pyro_invariance.infer.interrupts import FitInterrupted
from pyro_invariance.infer.runlock import RunLock, RunLockedError

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
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
FIT = ["fit", "--model", "invariant-mlp", "--guide", "mean-field", "--data", "rotated-digits", *SMALL]


@pytest.fixture(scope="module")
def data():
    return small_digits()


_model, _run, _state = small_model, small_fit, fit_state


def _assert_same_run(a, b):
    assert a.history["elbo"] == b.history["elbo"]
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _cli(*args, **popen_kw):
    """The CLI as its own process (as a user runs it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pyro_invariance.cli", *map(str, args)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen_kw,
    )


# --------------------------------------------------------------------------------------------
# Safe loading: a checkpoint whose pickle runs code is refused by every route that reads files
# --------------------------------------------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "pyro_invariance.checkpoint/2", "step": 1, "model": _Payload(marker)}, path)
    assert not marker.exists()


def test_malicious_checkpoint_is_refused_by_fit_resume(data, tmp_path):
    marker = tmp_path / "pwned"
    _malicious(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError, match="unsafe|refused"):
        _run(data, checkpoint_path=tmp_path / "evil.pt", resume=True)
    assert not marker.exists()


@pytest.mark.parametrize("route", ["fit --resume", "evaluate --run"])
def test_malicious_checkpoint_is_refused_by_the_cli(tmp_path, capsys, route):
    marker, out = tmp_path / "pwned", tmp_path / "run"
    _malicious(out / "checkpoint.pt", marker)
    args = (
        [*FIT, "--steps", "4", "--out", str(out), "--resume"]
        if route == "fit --resume"
        else ["evaluate", "--run", str(out)]
    )
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "unsafe" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_load_run_refuses_malicious_checkpoint(tmp_path):
    from pyro_invariance.catalogue import load_run

    marker = tmp_path / "pwned"
    _malicious(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError):
        load_run(tmp_path / "evil.pt")
    assert not marker.exists()


def test_every_checkpoint_the_project_writes_loads_safely(data, tmp_path):
    """weights_only=True reads what fit writes (RNG states as tensors) and resumes bit-for-bit."""
    full = _run(data, checkpoint_path=tmp_path / "full.pt")
    _run(data, checkpoint_path=tmp_path / "part.pt", checkpoint_every=4, until_step=5)
    record = torch.load(tmp_path / "part.pt", weights_only=True)
    assert record["format"] == "pyro_invariance.checkpoint/2" and record["step"] == 5
    _assert_same_run(full, _run(data, checkpoint_path=tmp_path / "part.pt", resume=True))


# --------------------------------------------------------------------------------------------
# Integrity: checksum, format version
# --------------------------------------------------------------------------------------------


def test_changed_tensor_value_fails_the_checksum(data, tmp_path):
    path = tmp_path / "c.pt"
    _run(data, checkpoint_path=path, until_step=3)
    record = torch.load(path, weights_only=True)
    key = next(k for k, v in record["guide"].items() if v.is_floating_point())
    record["guide"][key].view(-1)[0] += 1e-6  # one value, as a flipped bit would
    torch.save(record, path)
    with pytest.raises(CheckpointError, match="checksum does not match"):
        load_checkpoint(path)


def test_flipped_byte_in_tensor_storage_is_refused(data, tmp_path):
    import zipfile

    path = tmp_path / "c.pt"
    _run(data, checkpoint_path=path, until_step=3)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        header = raw[info.header_offset : info.header_offset + 30]
        start = (
            info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
        )
    raw[start + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        _run(data, checkpoint_path=path, resume=True)


def test_digest_is_content_not_container():
    a = {"x": torch.arange(6.0).reshape(2, 3), "n": [1, 2.5, "s", None]}
    b = {"x": torch.arange(6.0).reshape(2, 3).t().contiguous().t(), "n": [1, 2.5, "s", None]}
    assert payload_digest(a) == payload_digest(b)
    assert payload_digest(a) != payload_digest({**a, "n": [1, 2.5, "s", 0]})
    assert payload_digest(torch.zeros(2)) != payload_digest(torch.zeros(2, dtype=torch.float64))


def test_older_format_is_refused_with_the_reason(tmp_path):
    torch.save({"format": "pyro_invariance.checkpoint/1", "step": 3}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="format 'pyro_invariance.checkpoint/1'"):
        load_checkpoint(tmp_path / "old.pt")


# --------------------------------------------------------------------------------------------
# Resume continues exactly the saved run, or says what differs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_kw, message",
    [
        ({"num_transforms": 8}, "model setting 'num_transforms': saved 4, now 8"),
        ({"sampling": "deterministic"}, "model setting 'sampling'"),
        ({"transform_on": "inputs"}, "model setting 'transform_on'"),
        ({"lengthscale": 2.0}, "model buffers differ"),
    ],
)
def test_resume_refuses_other_model_settings(data, tmp_path, model_kw, message):
    _run(data, checkpoint_path=tmp_path / "c.pt", until_step=3)
    with pytest.raises(CheckpointError, match=message):
        _run(data, model_kw, checkpoint_path=tmp_path / "c.pt", resume=True)


def test_resume_refuses_other_data(data, tmp_path):
    _run(data, checkpoint_path=tmp_path / "c.pt", until_step=3)
    x, y = data.x_train.clone(), data.y_train.clone()
    x[0, 0, 0, 0] += 0.5  # same N, one pixel changed
    with pytest.raises(CheckpointError, match="same shapes, different values"):
        _run((x, y), checkpoint_path=tmp_path / "c.pt", resume=True)
    with pytest.raises(CheckpointError, match=r"data: saved x torch.float32\(256, 1, 8, 8\).*now x torch.float32\(200"):
        _run((x[:200], y[:200]), checkpoint_path=tmp_path / "c.pt", resume=True)


def test_until_step_below_the_saved_step_is_refused(data, tmp_path):
    _run(data, checkpoint_path=tmp_path / "c.pt", until_step=6)
    with pytest.raises(CheckpointError, match="until_step=4 is below the checkpoint's step 6"):
        _run(data, checkpoint_path=tmp_path / "c.pt", resume=True, until_step=4)


def test_laplace_settings_are_part_of_the_run(tmp_path):
    from pyro_invariance.infer.laplace import fit_laplace
    from pyro_invariance.models.layerwise import LayerwiseNet

    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(24, 1, 8, 8, generator=gen), torch.randint(0, 3, (24,), generator=gen)

    def run(**kw):
        model = LayerwiseNet("fc+conv", (1, 8, 8), 3, alpha=1, prior="fixed")
        return fit_laplace(
            model,
            "map",
            (x, y),
            steps=8,
            ggn_batch_size=8,
            batch_size=8,
            progress=False,
            lr=1e-2,
            checkpoint_path=tmp_path / "l.pt",
            **kw,
        )

    run(every=2, warmup=2, until_step=3)
    with pytest.raises(CheckpointError, match="run_settings"):
        run(every=3, warmup=2, resume=True)
    run(every=2, warmup=2, resume=True)


# --------------------------------------------------------------------------------------------
# Writes: never overwrite a run silently, one writer, atomic, disk full
# --------------------------------------------------------------------------------------------


def test_existing_run_is_not_overwritten(data, tmp_path):
    path = tmp_path / "c.pt"
    _run(data, checkpoint_path=path)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="already exists and holds step 12.*resume=True.*overwrite=True"):
        _run(data, checkpoint_path=path, steps=5)
    assert path.read_bytes() == before
    _run(data, checkpoint_path=path, steps=5, overwrite=True)
    assert load_checkpoint(path)["step"] == 5


def test_cli_does_not_replace_a_finished_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*FIT, "--steps", "8", "--out", str(out)]) == 0
    result = (out / "result.json").read_bytes()
    capsys.readouterr()
    assert main([*FIT, "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "result.json").read_bytes() == result
    assert main([*FIT, "--steps", "2", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "result.json").read_text())["config"]["steps"] == 2


def test_a_second_writer_is_refused(data, tmp_path, capsys):
    path = tmp_path / "checkpoint.pt"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pyro_invariance.infer.runlock import RunLock; "
            f"RunLock({str(path)!r}).acquire(); print('locked', flush=True); time.sleep(60)",
        ],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            _run(data, checkpoint_path=path)
        assert main([*FIT, "--steps", "2", "--out", str(tmp_path)]) == 2
        assert f"being written by another process (pid {holder.pid})" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert not path.exists()
    _run(data, checkpoint_path=path, steps=2)  # the kernel released the dead holder's lock


def test_two_cli_writers_on_one_out(tmp_path):
    out = tmp_path / "run"
    args = [*FIT, "--steps", "200", "--checkpoint-every", "50", "--out", out]
    first, second = _cli(*args), _cli(*args)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert ("being written by another process" in loser or "already holds" in loser) and "Traceback" not in loser
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 200
    assert not list(out.glob("*.tmp"))


def test_lock_is_reentrant_in_one_process(tmp_path):
    with RunLock(tmp_path / "c.pt"), RunLock(tmp_path / "c.pt"):
        pass
    with RunLock(tmp_path / "c.pt"):
        pass


def test_disk_full_keeps_the_previous_checkpoint(data, tmp_path, monkeypatch):
    import pyro_invariance.infer.checkpoint as ck

    path = tmp_path / "c.pt"
    real_save, calls = torch.save, []

    def failing_save(obj, f, *a, **k):
        calls.append(obj["step"])
        if len(calls) == 2:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ck.torch, "save", failing_save)
    with pytest.raises(CheckpointError, match="no space left on device; the previous file is kept"):
        _run(data, checkpoint_path=path, checkpoint_every=3)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 3
    assert [p.name for p in tmp_path.iterdir() if p.name != "c.pt.lock"] == ["c.pt"]


# --------------------------------------------------------------------------------------------
# Divergence: the last finite checkpoint is kept, named, and can be rescued
# --------------------------------------------------------------------------------------------


def test_divergence_keeps_and_names_the_last_finite_checkpoint(data, tmp_path):
    path = tmp_path / "c.pt"
    wild = {"lr": 10.0, "eta_lr": 10.0, "factor_lr": 1.0}
    with pytest.raises(
        FloatingPointError, match=r"step \d+.*last finite checkpoint .*c\.pt' \(step (\d+)\) is kept"
    ) as info:
        _run(data, checkpoint_path=path, checkpoint_every=5, steps=30, **wild)
    state = load_checkpoint(path)
    assert f"(step {state['step']})" in str(info.value)
    for part in ("model", "guide"):
        assert all(torch.isfinite(v).all() for v in state[part].values() if v.is_floating_point())
    # rescue: same run, lower learning rates from the kept checkpoint
    rescued = _run(
        data,
        checkpoint_path=path,
        checkpoint_every=5,
        steps=30,
        resume=True,
        allow_changes=["lr", "eta_lr", "factor_lr"],
        lr=1e-2,
        eta_lr=1e-2,
        factor_lr=1e-3,
    )
    assert rescued.history["step"][-1] == 30 and all(map(torch.isfinite, map(torch.tensor, rescued.history["elbo"])))
    assert rescued.history["changes"][0]["step"] == state["step"]


def test_scale_underflow_names_the_step_and_the_parameter(data):
    model = _model()
    guide = guides.get("mean-field", model)
    pi.fit(model, guide, data, steps=1, progress=False)
    with torch.no_grad():
        name, p = next((n, p) for n, p in guide.named_parameters() if "scale" in n and "out_weight" in n)
        p.fill_(-1e4)  # softplus/exp of this underflows to exactly 0
    with pytest.raises(FloatingPointError, match=r"step 1: .*out_weight.*(constraint|scale)"):
        pi.fit(model, guide, data, steps=3, progress=False)


def test_allow_changes_is_only_for_learning_rates(data, tmp_path):
    with pytest.raises(ValueError, match="allow_changes may name only learning rates"):
        _run(data, checkpoint_path=tmp_path / "c.pt", resume=True, allow_changes=["steps"])
    with pytest.raises(ValueError, match="pass one of them"):
        _run(data, checkpoint_path=tmp_path / "c.pt", resume=True, overwrite=True)


# --------------------------------------------------------------------------------------------
# Interrupts: SIGINT / SIGTERM stop at a step boundary with a checkpoint; resume is bit-for-bit
# --------------------------------------------------------------------------------------------


def test_sigint_in_process_checkpoints_and_resumes_bit_for_bit(data, tmp_path):
    full = _run(data, checkpoint_path=tmp_path / "full.pt")
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job

    def interrupt(step, model, guide):
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(FitInterrupted, match=r"interrupted at step 5; checkpoint at .*part\.pt") as info:
        _run(data, checkpoint_path=tmp_path / "part.pt", callbacks=[interrupt])
    assert info.value.step == 5 and isinstance(info.value, KeyboardInterrupt)
    assert load_checkpoint(tmp_path / "part.pt")["step"] == 5
    assert signal.getsignal(signal.SIGINT) is before  # restored
    _assert_same_run(full, _run(data, checkpoint_path=tmp_path / "part.pt", resume=True))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < timeout
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main([*FIT, "--steps", "120", "--checkpoint-every", "10", "--out", str(out)]) == 0
    return json.loads((out / "result.json").read_text())["history"]["elbo"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_cli_interrupt_then_resume_is_bit_for_bit(tmp_path, uninterrupted, sig):
    """A CLI process stopped by a signal, resumed (in this process, one thread as the child):
    the result equals an uninterrupted run."""
    out = tmp_path / "run"
    args = [*FIT, "--steps", "120", "--checkpoint-every", "10", "--out", str(out)]
    proc = _cli(*args)
    _wait_for(out / "checkpoint.pt", proc)
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    err = proc.stderr.read()
    # the signal arrives right after step 10's checkpoint, with 110 steps to go: the run cannot finish first
    assert code == (128 + sig if sig != signal.SIGKILL else -sig), err
    if sig != signal.SIGKILL:
        assert "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert line.startswith("pyro-invariance: interrupted at step ") and str(out / "checkpoint.pt") in line
        step = int(line.split("interrupted at step ")[1].split(";")[0])
        assert load_checkpoint(out / "checkpoint.pt")["step"] == step
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "result.json").read_text())["history"]["elbo"] == uninterrupted


# --------------------------------------------------------------------------------------------
# CLI: one line, exit 2, before compute
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train-size", "0"], "--train-size must be an integer >= 1, got 0"),
        (["--model-arg", "hidden=[16,"], "--model-arg: 'hidden=[16,' is not valid JSON"),
        (["--model-arg", "lr=1e-"], "is not valid JSON"),
        (["--eval-samples", "0"], "--eval-samples must be"),
        (["--resume"], "--resume: no checkpoint at"),
        (["--allow-change", "steps", "--resume"], "--allow-change takes learning rates (lr,eta_lr,model_lr,factor_lr)"),
        (["--allow-change", "lr"], "without --resume"),
    ],
)
def test_cli_user_errors_are_one_line(tmp_path, capsys, extra, message):
    code = main([*FIT, "--steps", "2", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_cli_out_that_is_a_file_fails_before_compute(tmp_path, capsys, monkeypatch):
    import pyro_invariance.infer.training as training

    def no_compute(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("compute started")

    monkeypatch.setattr(training, "fit", no_compute)
    (tmp_path / "file").write_text("x")
    assert main([*FIT, "--steps", "2", "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    import pyro_invariance.diagnostics.compare as compare

    monkeypatch.setattr(compare, "compare_guides", no_compute)
    code = main(
        [
            "compare",
            "--model",
            "invariant-mlp",
            "--data",
            "digits",
            "--guides",
            "mean-field",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "file"),
            "--no-progress",
        ]
    )
    assert code == 2 and "is a file, not a folder" in capsys.readouterr().err


def test_cli_evaluate_is_seeded_and_repeatable(tmp_path):
    out = tmp_path / "run"
    assert main([*FIT, "--steps", "4", "--out", str(out)]) == 0
    runs = []
    for _ in range(2):
        assert main(["evaluate", "--run", str(out), "--eval-samples", "3"]) == 0
        runs.append(json.loads((out / "evaluation.json").read_text())["metrics"])
    assert runs[0] == runs[1]
    assert main(["evaluate", "--run", str(out), "--eval-samples", "3", "--seed", "1"]) == 0
    assert json.loads((out / "evaluation.json").read_text())["metrics"] != runs[0]
