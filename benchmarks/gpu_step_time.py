"""Time per training step of ``pyro_invariance.fit`` on CPU or GPU (issue 14, part 7).

Sections (``--sections``; each row: ms/step and peak memory, with the device named):

* ``mlp-overhead`` / ``mlp-paper``: the invariant MLP (rotation learned, block-Cholesky guide, RFF
  unless ``--activations``) at the overhead-bound size B = 32, S = 4, H = 64 and at paper 003's size
  B = 128, S = 32, H = 1024 (28×28 inputs, 10 classes, N = 60 000, i.e. the minibatch tiled). Variants:

  - ``fit``: ``pyro_invariance.fit``'s own loop (``compile="off"``, the default), timed between its
    callbacks; inside each callback, interleaved in rotated order, one step of each of
  - ``twin``: the hand-written torch twin of ``benchmarks/step_time.py`` (same ELBO, same transform
    path as the model, same parameter groups) with ``fit``'s optimiser (fused Adam), no host reads;
  - ``twin-adam``: the same twin as in ``results/step_time.md``: default (per-tensor) Adam and a
    finiteness check + ``loss.item()`` per step;
  - ``before``: the loop body of ``fit`` before issue 14 (Pyro validation on, Pyro's
    ``TraceMeanField_ELBO``, default Adam, finiteness check, ``loss.item()`` and η read back every
    step), on the model as it was (``transform_on="weights"``): "today's step" of the issue;
  - ``fit-capture``, ``fit-inductor`` and ``fit-cudagraphs``: separate ``fit`` runs with
    ``compile="capture"`` / ``"inductor"`` / ``"cudagraphs"`` (CUDA only), each with its own
    interleaved ``twin``, so that its ratio is from the same run; the capture / compile seconds of
    their first lean step are reported, and a fallback (the run then replayed the captured graph)
    is named in the verdict.

* ``hnn-sho``: the symmetrised HNN at the talk's SHO settings (hidden 200×200, S = 200 symmetry
  samples, E = 20 Euler sub-steps, K = 1, B = 28 pairs, matrix-normal guide) with 1 and 20 weight
  samples (``num_particles``; vectorised, as the model declares); ``before`` (the old loop, particles
  one after another) at 1 sample, and at 20 with ``--hnn-before-20`` (on a 2-core CPU with 23 GiB this
  was killed for memory: 20 sequential particles and the vectorised step alternating in one process).
* ``hnn-3body``: at the 3-body recipe's size (3 × 250 hidden, S = 100, E = 10, K = 10, 2 weight
  samples, B = 20 pairs, state dimension 12), ``fit`` and ``before``.
* ``layerwise``: :func:`benchmarks.layerwise_step_time.measure_layerwise` at α = 10 on 3×32×32 (MAP,
  MAP with Laplace updates, the torch twin), when that module is present.
* ``reference``: the JAX reference (``tychovdo/noethers-razor``) at the SHO and 3-body settings, when
  JAX is importable and ``--reference-dir`` names a checkout: its ``main.py`` runs with a stand-in
  ``wandb`` module that records the time of each epoch's first ``log`` call.

Timing: ``fit`` runs ``1 + warmup + steps`` steps (CUDA: one more, for peak memory); its step k is the wall time from the end of
callback k−1 to the start of callback k (the whole loop: step, bulk reads, snapshots), recorded for
the ``steps`` steps after the first (validated) step and ``warmup`` more (the capture / compilation
happens on step 2). The interleaved variants run once per callback and are recorded at the same
callbacks. On CUDA every interval is closed by ``torch.cuda.synchronize()``. Reported: median, mean
and IQR per variant; ratio of medians and the paired ratio (median over callbacks of fit's step over
the twin's step in the same callback). Peak memory: CUDA ``max_memory_allocated`` over the extra last
step minus the memory allocated before it; CPU the peak resident set during steps 2 and 3 minus the
resident set before step 1 (model, guide and data built; optimiser state and fit's state copies
count, fit's one-time check of the data at the API boundary does not), in a fresh process per
variant run with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed memory leaves the resident set
(``--no-memory`` skips; not for ``fit-inductor`` on CPU, which would compile again).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cold-compile" in sys.argv:  # before torch is imported: Inductor reads its cache location once
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu_step_time_inductor_")

import _common as common  # noqa: E402

import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides, pyro_scope  # noqa: E402
from pyro_invariance.infer import training  # noqa: E402
from pyro_invariance.infer.fast_step import make_optimizer, preserved_validation  # noqa: E402
from pyro_invariance.models.base import symmetry_summary  # noqa: E402

SECTIONS = ("mlp-overhead", "mlp-paper", "hnn-sho", "hnn-3body", "layerwise", "reference")
MLP_SIZES = {
    "mlp-overhead": {"batch": 32, "samples": 4, "hidden": 64, "side": 28, "classes": 10, "num_data": 60000},
    "mlp-paper": {"batch": 128, "samples": 32, "hidden": 1024, "side": 28, "classes": 10, "num_data": 60000},
}
HNN = {
    "hnn-sho": {"state_dim": 2, "hidden": (200, 200), "num_generators": 1, "num_transforms": 200, "euler_steps": 20,
                "dt": 0.2, "sampling": "cube", "batch": 28, "particles": (1, 20)},
    "hnn-3body": {"state_dim": 12, "hidden": (250, 250, 250), "num_generators": 10, "num_transforms": 100,
                  "euler_steps": 10, "dt": 1.0, "sampling": "ball", "batch": 20, "particles": (2,)},
}  # fmt: skip
#: the JAX reference's command-line settings for the same two systems (scripts/*/table*.sh of the reference)
REFERENCE_ARGS = {
    "hnn-sho": ["--group", "quadratic_learn1", "--train_size", "7", "--train_steps", "4", "--steps", "20",
                "--stepsize", "0.20", "--sym_steps", "50", "--vi", "--dynamics", "harmonic-oscillator", "--act_fun",
                "elu2", "--n_layers", "3", "--n_hidden", "200", "--sym_samples", "200", "--sym_over_path",
                "--mc_samples", "20"],
    "hnn-3body": ["--group", "quadratic_learn10", "--batch_size", "20", "--vi", "--dynamics", "nbody_2d_3b",
                  "--train_size", "200", "--train_steps", "50", "--stepsize", "1.0", "--act_fun", "elu", "--n_hidden",
                  "250", "--n_layers", "4", "--sym_samples", "100", "--sym_over_path", "--mc_samples", "2",
                  "--measure_dist", "ball"],
}  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary(ts: list[float]) -> dict[str, float]:
    if not ts:
        return {}
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {"median": statistics.median(ts), "mean": statistics.fmean(ts), "min": min(ts), "q1": q[0], "q3": q[2],
            "n": len(ts)}  # fmt: skip


# --------------------------------------------------------------------------------------------
# Cases: model, guide, data, and the steppers interleaved with fit
# --------------------------------------------------------------------------------------------
def _tiled(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    reps = -(-n // x.shape[0])
    return x.repeat(reps, *[1] * (x.dim() - 1))[:n], y.repeat(reps, *[1] * (y.dim() - 1))[:n]


def build_case(section: str, seed: int, device: torch.device, activation: str = "rff",
               transform_on: str = "auto", particles: int = 1) -> dict[str, Any]:  # fmt: skip
    """Model, guide (set up), full training data (x, y) and fit's batch size for a section."""
    import step_time

    if section in MLP_SIZES:
        cfg = MLP_SIZES[section]
        gen = torch.Generator().manual_seed(seed)
        x = torch.rand(cfg["batch"], 1, cfg["side"], cfg["side"], generator=gen)
        y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen)
        with pyro_scope():
            model, guide = step_time.build_pyro(activation, cfg, x, y, seed, transform_on=transform_on)
        x_all, y_all = _tiled(x, y, cfg["num_data"])
        return {"model": model, "guide": guide, "x": x_all, "y": y_all, "batch": cfg["batch"], "cfg": cfg,
                "fit": {"batch_size": cfg["batch"]}}  # fmt: skip
    from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN

    h = HNN[section]
    pyro.set_rng_seed(seed)
    model = SymmetrisedHNN(h["state_dim"], h["hidden"], symmetry="quadratic", num_generators=h["num_generators"],
                           num_transforms=h["num_transforms"], euler_steps=h["euler_steps"], dt=h["dt"],
                           sampling=h["sampling"])  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(h["batch"], h["state_dim"], generator=gen), torch.randn(h["batch"], h["state_dim"], generator=gen)
    with pyro_scope():
        guide = guides.get("matrix-normal", model, init_scale=0.01)
        with pyro.poutine.block():
            guide(x, y, num_data=h["batch"])
    return {"model": model, "guide": guide, "x": x, "y": y, "batch": h["batch"], "cfg": h,
            "fit": {"batch_size": None, "num_particles": particles}}  # fmt: skip


def _batches(case: dict[str, Any], seed: int, device: torch.device) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    x, y = case["x"].to(device), case["y"].to(device)
    shuffler = training._Batches(x.shape[0], case["batch"], seed, device)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        idx = shuffler.next()
        return x[idx], y[idx]

    return next_batch


def make_twin_step(case: dict[str, Any], total_steps: int, seed: int, device: torch.device,
                   default_adam: bool = False) -> Callable[[], None]:  # fmt: skip
    """The hand-written twin of the invariant MLP (step_time.py) on fit's minibatches."""
    import step_time

    hand = step_time.HandWrittenInvariantMLP(case["model"], case["guide"]).to(device)
    cfg = training.FitConfig()
    groups = hand.param_groups(cfg)
    optim = torch.optim.Adam(groups) if default_adam else make_optimizer(groups)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    next_batch, n = _batches(case, seed, device), case["x"].shape[0]

    def step() -> None:
        x, y = next_batch()
        optim.zero_grad(set_to_none=True)
        loss = hand.loss(x, y, n)
        if default_adam:  # as results/step_time.md: a host read per step
            if not torch.isfinite(loss):
                raise FloatingPointError("non-finite loss")
            loss.item()
        loss.backward()
        optim.step()
        sched.step()

    return step


def make_before_step(case: dict[str, Any], total_steps: int, seed: int, device: torch.device) -> Callable[[], None]:
    """fit's loop body before issue 14: validation on, Pyro's ELBO, default Adam, host reads per step."""
    model, guide = case["model"].to(device), case["guide"].to(device)
    cfg = training.FitConfig(**{k: v for k, v in case["fit"].items() if k == "num_particles"})
    optim = torch.optim.Adam(training._param_groups(model, guide, cfg))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    loss_fn = TraceMeanField_ELBO(num_particles=cfg.num_particles, vectorize_particles=False)
    next_batch, n = _batches(case, seed, device), case["x"].shape[0]

    def step() -> None:
        x, y = next_batch()
        with pyro_scope(), preserved_validation():
            pyro.enable_validation(True)
            loss = common.legacy_svi_step(loss_fn, model, guide, optim, sched, x, y, n)
            -loss.item() / n
            [float(v) for v in symmetry_summary(model, guide).values()]

    return step


# --------------------------------------------------------------------------------------------
# Peak memory
# --------------------------------------------------------------------------------------------
class CudaPeak:
    def __init__(self, device: torch.device) -> None:
        self.device, self.base = device, 0

    def start(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)

    def stop(self) -> float:
        torch.cuda.synchronize(self.device)
        return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (``/proc/self/clear_refs`` 5, Linux ≥ 4.0); returns the RSS now."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _rss_bytes()


def _peak_rss_bytes() -> int:
    """VmHWM (the peak RSS since the last reset), else ``ru_maxrss``."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _probe_main(spec: dict[str, Any]) -> None:
    """Subprocess entry (CPU peak memory): build one variant; RSS before its first step; the peak RSS
    of steps 2 and 3 (the kernel's mark reset after step 1, so that ``fit``'s one-time check of the
    data at the API boundary is left out) minus that RSS."""
    common.set_threads(spec["threads"])
    device = torch.device("cpu")
    variant, seed = spec["variant"], spec["seed"]
    case = build_case(spec["section"], seed, device, spec["activation"],
                      "weights" if variant == "before" else "auto", spec["particles"])  # fmt: skip
    make_optimizer([{"params": [torch.nn.Parameter(torch.zeros(1))]}])  # the first optimiser imports torch._dynamo
    base = _rss_bytes()
    if variant.startswith("fit"):
        mode = {"fit": "off", "fit-capture": "capture", "fit-inductor": "inductor", "fit-cudagraphs": "cudagraphs"}[variant]

        def reset(step: int, model: Any, guide: Any) -> None:
            if step == 1:
                _reset_peak_rss()

        pi.fit(case["model"], case["guide"], (case["x"], case["y"]), steps=3, progress=False, seed=seed, compile=mode,
               callbacks=[reset], **case["fit"])  # fmt: skip
    else:
        step = {"twin": lambda: make_twin_step(case, 10, seed, device),
                "twin-adam": lambda: make_twin_step(case, 10, seed, device, default_adam=True),
                "before": lambda: make_before_step(case, 10, seed, device)}[variant]()  # fmt: skip
        base = _rss_bytes()
        step()
        _reset_peak_rss()
        step()
        step()
    print("PROBE " + json.dumps({"peak_mib": max(0.0, (_peak_rss_bytes() - base) / 2**20)}), flush=True)


def cpu_peak(section: str, variant: str, seed: int, threads: int, activation: str, particles: int) -> float | None:
    spec = {"section": section, "variant": variant, "seed": seed, "threads": threads, "activation": activation,
            "particles": particles}  # fmt: skip
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", json.dumps(spec)]
    # freed blocks go back to the OS at once, so that the resident set follows the live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(common.REPO_ROOT), env=env)
    for line in out.stdout.splitlines():
        if line.startswith("PROBE "):
            return float(json.loads(line[6:])["peak_mib"])
    common.log(f"memory probe {section}/{variant} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return None


# --------------------------------------------------------------------------------------------
# Timing fit's loop with other steps interleaved in its callbacks
# --------------------------------------------------------------------------------------------
def _tf32(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """``--tf32``: ``fit(tf32=True)`` in every timed ``fit`` run on CUDA."""
    return {"tf32": True} if args.tf32 and device.type == "cuda" else {}


def time_fit(case: dict[str, Any], others: dict[str, Callable[[], None]], warmup: int, steps: int, seed: int,
             device: torch.device, **fit_kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """``fit`` for 1 + warmup + steps (+ 1 on CUDA) steps; one step of each of ``others`` in each callback."""
    names = list(others)
    times: dict[str, list[float]] = {"fit": [], **{k: [] for k in names}}
    peaks: dict[str, float] = {}
    first, last = warmup + 2, warmup + steps + 1  # recorded callbacks
    cuda_peak = CudaPeak(device) if device.type == "cuda" else None
    memory_step = last + 1 if cuda_peak is not None else last  # CUDA: one more step, for the allocator's peak
    clock = {"end": None}

    def callback(step: int, model: Any, guide: Any) -> None:
        _sync(device)
        now = time.perf_counter()
        if cuda_peak is not None and step == memory_step:
            peaks["fit"] = cuda_peak.stop()
        if clock["end"] is not None and first <= step <= last:
            times["fit"].append(now - clock["end"])
        order = names[step % len(names):] + names[: step % len(names)] if names else []
        for name in order:
            if cuda_peak is not None and step == memory_step:
                cuda_peak.start()
            t0 = time.perf_counter()
            others[name]()
            _sync(device)
            if first <= step <= last:
                times[name].append(time.perf_counter() - t0)
            if cuda_peak is not None and step == memory_step:
                peaks[name] = cuda_peak.stop()
        if cuda_peak is not None and step == memory_step - 1:
            cuda_peak.start()
        _sync(device)
        clock["end"] = time.perf_counter()

    t0 = time.perf_counter()
    result = pi.fit(case["model"], case["guide"], (case["x"], case["y"]), steps=memory_step, progress=False, seed=seed,
                    callbacks=[callback], device=str(device), **case["fit"], **fit_kwargs)  # fmt: skip
    wall = time.perf_counter() - t0
    stats = {k: summary(v) for k, v in times.items()}
    paired = {k: summary([a / b for a, b in zip(times[k], times["twin"])]) for k in times} if "twin" in times else {}
    return {"times": times, "stats": stats, "paired_to_twin": paired, "peak_mib": peaks, "wall_s": wall,
            "step_stats": result.step_stats, "warmup": warmup, "steps": steps}  # fmt: skip


def run_mlp(section: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    warmup, steps = (args.warmup, args.steps) if section == "mlp-overhead" else (args.paper_warmup, args.paper_steps)
    total = 1 + warmup + steps + 1
    out: dict[str, Any] = {"sizes": MLP_SIZES[section], "activations": {}}
    for act in args.activations:
        runs: dict[str, Any] = {}
        common.log(f"[{section}/{act}] fit (compile off) with twin, twin-adam and before interleaved")
        case = build_case(section, args.seed, device, act)
        before_case = build_case(section, args.seed, device, act, transform_on="weights")
        others = {"twin": make_twin_step(case, total, args.seed, device),
                  "twin-adam": make_twin_step(case, total, args.seed, device, default_adam=True),
                  "before": make_before_step(before_case, total, args.seed, device)}  # fmt: skip
        runs["fit"] = time_fit(case, others, warmup, steps, args.seed, device, **_tf32(args, device))
        common.log(f"[{section}/{act}] " + _brief(runs["fit"]))
        for mode in args.compile_modes:
            common.log(f"[{section}/{act}] fit compile={mode} with twin interleaved")
            case = build_case(section, args.seed, device, act)
            twin = {"twin": make_twin_step(case, total, args.seed, device)}
            runs[f"fit-{mode}"] = time_fit(case, twin, warmup, steps, args.seed, device, compile=mode,
                                           **_tf32(args, device))
            common.log(f"[{section}/{act}] " + _brief(runs[f"fit-{mode}"]))
        if args.memory and device.type == "cpu":
            for run, variants in (("fit", ["fit", "twin", "twin-adam", "before"]),
                                  *((f"fit-{m}", [f"fit-{m}"]) for m in args.compile_modes if m != "inductor")):  # fmt: skip
                for v in variants:
                    runs[run]["peak_mib"][v] = cpu_peak(section, v, args.seed, args.threads, act, 1)
        out["activations"][act] = runs
    return out


def run_hnn(section: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {k: v for k, v in HNN[section].items()}, "particles": {}}
    particles = HNN[section]["particles"] if section != "hnn-sho" or not args.sho_particles else args.sho_particles
    for p in particles:
        case = build_case(section, args.seed, device, particles=p)
        total = 1 + args.hnn_warmup + args.hnn_steps + 1
        others = {}
        if p == 1 or args.hnn_before_20 or section != "hnn-sho":
            others["before"] = make_before_step(build_case(section, args.seed, device, particles=p), total, args.seed, device)
        common.log(f"[{section}] P={p}: fit with {list(others)} interleaved")
        entry = time_fit(case, others, args.hnn_warmup, args.hnn_steps, args.seed, device, **_tf32(args, device))
        common.log(f"[{section}] P={p}: " + _brief(entry))
        if args.memory and device.type == "cpu" and (section != "hnn-sho" or args.hnn_memory):
            for v in ["fit", *others]:
                entry["peak_mib"][v] = cpu_peak(section, v, args.seed, args.threads, "rff", p)
        out["particles"][str(p)] = entry
        for mode in args.hnn_compile_modes:
            common.log(f"[{section}] P={p}: fit compile={mode}")
            case = build_case(section, args.seed, device, particles=p)
            e = time_fit(case, {}, args.hnn_warmup, args.hnn_steps, args.seed, device, compile=mode,
                         **_tf32(args, device))
            common.log(f"[{section}] P={p} compile={mode}: " + _brief(e))
            out["particles"][f"{p} ({mode})"] = e
    return out


def _brief(entry: dict[str, Any]) -> str:
    parts = [f"{k} {v['median'] * 1e3:.1f} ms" for k, v in entry["stats"].items() if v]
    extra = {k: v for k, v in entry["step_stats"].items() if k in ("compile", "capture_seconds", "compile_seconds", "fallback")}
    return ", ".join(parts) + (f" {extra}" if extra else "")


# --------------------------------------------------------------------------------------------
# Layer-wise and the JAX reference
# --------------------------------------------------------------------------------------------
def run_layerwise(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    try:
        module = importlib.import_module("layerwise_step_time")
        measure = module.measure_layerwise
    except (ImportError, AttributeError) as exc:
        msg = f"skipped: benchmarks/layerwise_step_time.py with measure_layerwise() is not available ({exc})"
        common.log(msg)
        return {"skipped": msg}
    memory = args.memory and (device.type == "cuda" or args.layerwise_memory)
    kwargs = {"memory": memory} if "memory" in inspect.signature(measure).parameters else {}
    if args.layerwise_variants:
        kwargs["variants"] = args.layerwise_variants
    rows = measure(str(device), args.alpha, args.layerwise_steps, args.layerwise_warmup, **kwargs)
    return {"alpha": args.alpha, "rows": rows}


WANDB_STUB = '''"""Stand-in for wandb (gpu_step_time.py): records the time of each epoch's first log call."""
import atexit, json, os, time
_first = {}
class _Run:
    name = "gpu-step-time"
run = _Run()
config = {}
def init(*args, **kwargs):
    return run
def log(data=None, step=None, *args, **kwargs):
    _first.setdefault(step, time.perf_counter())
def Image(*args, **kwargs):
    return None
atexit.register(lambda: open(os.environ["GPU_STEP_TIME_WANDB_OUT"], "w").write(json.dumps(sorted((k, v) for k, v in _first.items() if k is not None))))
'''


def run_reference(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The JAX reference at the HNN sections' settings: seconds per epoch from the wandb stand-in."""
    if args.reference_dir is None:
        return {"skipped": "no --reference-dir (a checkout of tychovdo/noethers-razor)"}
    try:
        importlib.import_module("jax")
    except ImportError:
        return {"skipped": "JAX is not importable in this environment"}
    ref = Path(args.reference_dir)
    if not (ref / "main.py").exists():
        return {"skipped": f"{ref}/main.py does not exist"}
    out: dict[str, Any] = {}
    for section, ref_args in REFERENCE_ARGS.items():
        if section not in (args.reference_systems or args.sections):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "wandb.py").write_text(WANDB_STUB)
            log_path = Path(tmp, "epochs.json")
            epochs = args.hnn_warmup + args.hnn_steps + 1
            env = {**os.environ, "PYTHONPATH": tmp + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   "GPU_STEP_TIME_WANDB_OUT": str(log_path)}  # fmt: skip
            if device.type == "cpu":
                env["JAX_PLATFORMS"] = "cpu"
            else:  # this process's torch still holds GPU memory: JAX must not claim 75 % of it up front
                env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
                torch.cuda.empty_cache()
            cmd = [sys.executable, "main.py", *ref_args, "--n_epochs", str(epochs), "--seed", str(args.seed)]
            common.log(f"[reference/{section}] {' '.join(cmd)}")
            proc = subprocess.run(cmd, cwd=ref, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not log_path.exists():
                out[section] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            marks = json.loads(log_path.read_text())
            gaps = [b[1] - a[1] for a, b in zip(marks, marks[1:]) if a[0] >= 1 + args.hnn_warmup]
            per_epoch = 1 if section == "hnn-sho" else 10  # 7 trajectories full batch; 200 / batch 20
            out[section] = {"epoch_seconds": gaps, "s_per_step": statistics.median(gaps) / per_epoch if gaps else None,
                            "steps_per_epoch": per_epoch, "command": cmd}  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def _ms(s: dict[str, float] | None, key: str = "median") -> str:
    return f"{s[key] * 1e3:.1f}" if s else "–"


def _mib(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def render(info: dict[str, Any], settings: dict[str, Any], results: dict[str, Any], device: torch.device,
           command: str | None = None) -> str:  # fmt: skip
    title = f"Training step time on {device.type.upper()}: fit's loop vs a hand-written twin, compiled, and before issue 14"
    intro = ("Issue 14, part 7. Every `fit` row is `pyro_invariance.fit`'s own loop, timed between its callbacks; the "
             "other variants run one step each inside those callbacks, interleaved, so machine load hits them alike. "
             "See the docstring of `benchmarks/gpu_step_time.py` for the variants. The machine is shared with other "
             "jobs (load average above): compare ratios within a run, not absolute times across runs.")  # fmt: skip
    out = [common.header_markdown(title, info, settings, command or common.command_line(), intro)]
    verdict: list[str] = []
    for section in ("mlp-overhead", "mlp-paper"):
        if section not in results:
            continue
        res = results[section]
        out += [f"## Invariant MLP, {section.split('-')[1]} size ({_size(res['sizes'])})", ""]
        for act, runs in res["activations"].items():
            rows = []
            for run_name, entry in runs.items():
                for name, st in entry["stats"].items():
                    label = run_name if name == "fit" else f"{name} (in {run_name})"
                    pr = entry["paired_to_twin"].get(name)
                    twin = entry["stats"].get("twin")
                    rows.append([act.upper(), f"`{label}`", _ms(st), _ms(st, "mean"), f"{_ms(st, 'q1')}–{_ms(st, 'q3')}",
                                 f"{st['median'] / twin['median']:.2f}×" if twin else "–",
                                 f"{pr['median']:.2f}× ({pr['q1']:.2f}–{pr['q3']:.2f})" if pr else "–",
                                 _mib(entry["peak_mib"].get(run_name if name == "fit" else name, entry["peak_mib"].get(name)))])  # fmt: skip
                if run_name != "fit":
                    ss = entry["step_stats"]
                    rows.append([act.upper(), f"`{run_name}` first lean step", "", "", "", "", "",
                                 f"capture {ss.get('capture_seconds', float('nan')):.1f} s"
                                 + (f", compile {ss['compile_seconds']:.1f} s" if ss.get("compile_seconds") else "")
                                 + (f", fell back: {ss['fallback']}" if ss.get("fallback") else "")])  # fmt: skip
            out += [common.md_table(["act.", "variant", "median ms", "mean ms", "IQR ms", "ratio of medians to twin",
                                     "paired ratio to twin (IQR)", "peak MiB"], rows), ""]  # fmt: skip
            fit = runs["fit"]
            f_med = fit["stats"]["fit"]["median"]
            if section == "mlp-overhead":
                r, p = f_med / fit["stats"]["twin"]["median"], fit["paired_to_twin"]["fit"]["median"]
                b = fit["stats"]["before"]["median"] / fit["stats"]["twin"]["median"]
                verdict.append(f"- overhead-bound size, {act.upper()}: fit / twin = {r:.2f}× (ratio of medians), {p:.2f}× "
                               f"(paired) — criterion ≤ 1.3×: {'met' if max(r, p) <= 1.3 else 'not met'}; the step "
                               f"before issue 14 / twin = {b:.2f}×.")  # fmt: skip
                for mode in ("fit-capture", "fit-inductor", "fit-cudagraphs"):
                    if mode in runs:
                        e = runs[mode]
                        verdict.append(f"- overhead-bound size, {act.upper()}, `{mode}`: {e['stats']['fit']['median'] / e['stats']['twin']['median']:.2f}× "
                                       f"the twin (ratio of medians), {e['paired_to_twin']['fit']['median']:.2f}× paired.")  # fmt: skip
            else:
                speed = fit["stats"]["before"]["median"] / f_med
                paired = statistics.median(b / f for b, f in zip(fit["times"]["before"], fit["times"]["fit"]))
                verdict.append(f"- paper size, {act.upper()}: today's step (before issue 14) {_ms(fit['stats']['before'])} ms, "
                               f"fit {f_med * 1e3:.1f} ms: {speed:.2f}× faster (ratio of medians; paired {paired:.2f}×) — "
                               f"CPU criterion ≥ 1.5×: {'met' if min(speed, paired) >= 1.5 else 'not met'}"
                               f"{' (this is a GPU run)' if device.type == 'cuda' else ''}; fit / twin = "
                               f"{f_med / fit['stats']['twin']['median']:.2f}×.")  # fmt: skip
                for mode in ("fit", "fit-capture", "fit-inductor", "fit-cudagraphs"):
                    if mode in runs:
                        e = runs[mode]
                        ratio = e['stats']['fit']['median'] / e['stats']['twin']['median']
                        fell = _fell_back(e)
                        gpu = (f" — GPU criterion ≤ 1.15× the twin and ≤ 5 ms: "
                               f"{'met' if ratio <= 1.15 and e['stats']['fit']['median'] <= 5e-3 and not fell else 'not met'}"
                               if device.type == "cuda" else "")  # fmt: skip
                        gpu += fell
                        verdict.append(f"- paper size, {act.upper()}, `{mode}`: {_ms(e['stats']['fit'])} ms, "
                                       f"{ratio:.2f}× the twin of its run ({_ms(e['stats']['twin'])} ms){gpu}.")  # fmt: skip
    for section in ("hnn-sho", "hnn-3body"):
        if section not in results:
            continue
        res = results[section]
        h = res["settings"]
        out += [f"## Symmetrised HNN, {section.split('-')[1]} (hidden {h['hidden']}, S = {h['num_transforms']}, "
                f"E = {h['euler_steps']}, K = {h['num_generators']}, B = {h['batch']})", ""]  # fmt: skip
        rows = []
        for p, entry in res["particles"].items():
            for name, st in entry["stats"].items():
                if st:
                    rows.append([p, f"`{name}`", _ms(st), _ms(st, "mean"), f"{_ms(st, 'q1')}–{_ms(st, 'q3')}", st["n"],
                                 _mib(entry["peak_mib"].get(name))])  # fmt: skip
            if entry["stats"].get("before"):
                paired = statistics.median(b / f for b, f in zip(entry["times"]["before"], entry["times"]["fit"]))
                verdict.append(f"- {section}, {p} weight sample(s): before / fit = "
                               f"{entry['stats']['before']['median'] / entry['stats']['fit']['median']:.2f}× "
                               f"(ratio of medians; paired {paired:.2f}×).")
        out += [common.md_table(["weight samples", "variant", "median ms", "mean ms", "IQR ms", "steps", "peak MiB"], rows), ""]
        if device.type == "cuda" and section == "hnn-sho":
            for p, entry in res["particles"].items():
                verdict.append(f"- hnn-sho, {p} weight sample(s): fit {entry['stats']['fit']['median'] * 1e3:.1f} ms/step"
                               f"{_fell_back(entry)}.")  # fmt: skip
        if device.type == "cuda" and section == "hnn-3body":
            for p, entry in res["particles"].items():
                med, fell = entry["stats"]["fit"]["median"], _fell_back(entry)
                verdict.append(f"- hnn-3body, {p} weight samples: fit {med * 1e3:.1f} ms/step — GPU criterion ≤ 50 ms: "
                               f"{'met' if med <= 0.05 and not fell else 'not met'}{fell}.")  # fmt: skip
        ref = results.get("reference", {}).get(section, {})
        if ref.get("s_per_step"):
            for p, entry in res["particles"].items():
                ratio = entry["stats"]["fit"]["median"] / ref["s_per_step"]
                crit = (f" — criterion ≤ 0.5× at 20 samples: {'met' if ratio <= 0.5 else 'not met'}"
                        if section == "hnn-sho" and p.split()[0] == "20" else "")  # fmt: skip
                verdict.append(f"- {section}, {p} weight sample(s): fit / JAX reference ({ref['s_per_step'] * 1e3:.1f} ms, "
                               f"its own weight samples) = {ratio:.2f}×{crit}.")  # fmt: skip
    if "layerwise" in results:
        res = results["layerwise"]
        out += [f"## Layer-wise networks, α = {res.get('alpha', '–')}, 3×32×32", ""]
        if "skipped" in res:
            out += [res["skipped"], ""]
        else:
            rows = [[r.get("model"), f"`{r.get('variant')}`", f"{r.get('ms_per_step', float('nan')):.1f}",
                     f"{r.get('ratio_to_twin', float('nan')):.2f}×", _mib(r.get("peak_mem_mib"))] for r in res["rows"]]  # fmt: skip
            for r in res["rows"]:
                if (r.get("variant") == "pyro-map" or str(r.get("variant")).startswith("fit-")) and device.type == "cuda":
                    verdict.append(f"- layer-wise α = {res.get('alpha')}, {r.get('model')}, `{r.get('variant')}`: MAP step "
                                   f"{r.get('ratio_to_twin', float('nan')):.2f}× its torch twin — GPU criterion ≤ 2×: "
                                   f"{'met' if r.get('ratio_to_twin', 9) <= 2 else 'not met'}.")  # fmt: skip
            out += [common.md_table(["model", "variant", "ms/step (amortised median)", "ratio to twin", "peak MiB"], rows),
                    "", "Details: `benchmarks/layerwise_step_time.py` (this run's rows are in the JSON).", ""]  # fmt: skip
    if "reference" in results:
        res = results["reference"]
        out += ["## JAX reference (tychovdo/noethers-razor)", ""]
        if "skipped" in res:
            out += [f"Not run: {res['skipped']}.", ""]
        else:
            rows = [[s, f"{e['s_per_step'] * 1e3:.1f}" if e.get("s_per_step") else e.get("error", "–")] for s, e in res.items()]
            out += [common.md_table(["system", "ms/step"], rows), ""]
    out += ["## Verdict", "", *(verdict or ["- (no section with a criterion was run)"]), ""]
    return "\n".join(out)


def _fell_back(entry: dict[str, Any]) -> str:
    """'' or a note that a compiled run fell back (its times are then the captured graph's)."""
    why = entry.get("step_stats", {}).get("fallback")
    return f" (fell back to `{entry['step_stats'].get('compile')}`: {why}; not a compiled number)" if why else ""


def _size(c: dict[str, int]) -> str:
    return f"B = {c['batch']}, S = {c['samples']}, H = {c['hidden']}, {c['side']}×{c['side']}, N = {c['num_data']}"


# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--sections", default=",".join(s for s in SECTIONS if s != "reference"),
                        help=f"comma-separated, of {','.join(SECTIONS)}")  # fmt: skip
    parser.add_argument("--activations", default="rff", help="invariant MLP: comma-separated rff, relu")
    parser.add_argument("--compile-modes", default="capture,inductor", help="extra fit runs: capture, inductor (or 'none')")
    parser.add_argument("--warmup", type=int, default=20, help="overhead-bound size: untimed steps after the first")
    parser.add_argument("--steps", type=int, default=200, help="overhead-bound size: timed steps")
    parser.add_argument("--paper-warmup", type=int, default=2)
    parser.add_argument("--paper-steps", type=int, default=20)
    parser.add_argument("--hnn-warmup", type=int, default=1)
    parser.add_argument("--hnn-steps", type=int, default=3)
    parser.add_argument("--sho-particles", default="", help="SHO weight samples to time (default 1,20; the 20-sample "
                        "step holds ~8.5 GiB on CPU)")
    parser.add_argument("--hnn-compile-modes", default="none", help="HNN: extra fit runs with compile= capture, inductor")
    parser.add_argument("--hnn-before-20", action="store_true", help="also time the old loop at 20 weight samples (slow)")
    parser.add_argument("--hnn-memory", action="store_true", help="CPU: memory probes for the SHO settings too (slow)")
    parser.add_argument("--alpha", type=int, default=10, help="layer-wise width α")
    parser.add_argument("--layerwise-memory", action="store_true",
                        help="CPU: measure_layerwise's memory probes too (on a 2-core CPU at α = 10 they reported ~14 GiB)")
    parser.add_argument("--layerwise-variants", default="", help="layer-wise variants (default: measure_layerwise's: "
                        "pyro-map, pyro-map+laplace, twin; also fit-lean, fit-capture, fit-cudagraphs)")
    parser.add_argument("--layerwise-steps", type=int, default=10)
    parser.add_argument("--layerwise-warmup", type=int, default=10)
    parser.add_argument("--reference-dir", type=Path, default=None, help="a checkout of tychovdo/noethers-razor")
    parser.add_argument("--tf32", action="store_true",
                        help="CUDA: fit(tf32=True) for the invariant-MLP and HNN rows; the variants interleaved in fit's "
                        "callbacks run inside fit's TF32 block too")
    parser.add_argument("--reference-systems", default="", help="reference: the systems to run (default: the HNN "
                        "sections among --sections)")
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--stem", default=None, help="results file stem (default gpu_step_time_<device type>)")
    parser.add_argument("--cold-compile", action="store_true",
                        help="an empty Inductor cache (TORCHINDUCTOR_CACHE_DIR), so that compile times are first-time times")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rerender", type=Path, nargs="+", default=None,
                        help="re-render the tables of these results JSON files (written by this script, e.g. on a GPU "
                        "machine by benchmarks/gpu_session.sh) into --out-dir, with today's report code")
    parser.add_argument("--with-reference", type=Path, default=None,
                        help="with --rerender: the JAX reference's timings from this results JSON of the same GPU session "
                        "(its 'reference' part) join the tables and verdicts (the JSON files themselves are unchanged)")
    args = parser.parse_args(argv)
    if args.rerender:
        for path in args.rerender:
            payload = json.loads(Path(path).read_text())
            device = torch.device(payload["settings"]["device"])
            command = payload["command"]
            if device.type == "cuda":  # run by gpu_session.sh into a temporary folder on the GPU machine
                part = Path(path).stem.removeprefix("gpu_step_time_cuda_")
                command = (f"OUT=<folder> bash benchmarks/gpu_session.sh   # part '{part}': "
                           + command.split("--stem", 1)[-1].split(" ", 2)[-1])  # fmt: skip
            results = payload["results"]
            if args.with_reference is not None:
                reference = json.loads(args.with_reference.read_text())["results"]["reference"]
                results = {**results, "reference": reference}
                command += f"\n# the JAX reference: {args.with_reference.name}, the same session (--with-reference)"
            md = render(payload["machine"], payload["settings"], results, device, command)
            md_path, _ = common.write_results(Path(path).stem, md, payload, args.out_dir)
            common.log(f"re-rendered {md_path}")
        return 0
    if args.probe:
        _probe_main(json.loads(args.probe))
        return 0
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; use {SECTIONS}")
    args.activations = [a.strip() for a in args.activations.split(",") if a.strip()]
    args.compile_modes = [m.strip() for m in args.compile_modes.split(",") if m.strip() and m.strip() != "none"]
    args.reference_systems = [v.strip() for v in args.reference_systems.split(",") if v.strip()]
    args.layerwise_variants = [v.strip() for v in args.layerwise_variants.split(",") if v.strip()]
    args.hnn_compile_modes = [m.strip() for m in args.hnn_compile_modes.split(",") if m.strip() and m.strip() != "none"]
    args.sho_particles = tuple(int(p) for p in args.sho_particles.split(",") if p.strip())
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    common.set_threads(args.threads)
    info = common.machine_info()
    info["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({info['cpu']}), {args.threads} thread(s)"
    common.log(f"device: {info['device']}; sections {args.sections}")
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    for section in args.sections:
        s0 = time.perf_counter()
        if section in MLP_SIZES:
            results[section] = run_mlp(section, args, device)
        elif section in HNN:
            results[section] = run_hnn(section, args, device)
        elif section == "layerwise":
            results[section] = run_layerwise(args, device)
        elif section == "reference":
            results[section] = run_reference(args, device)
        common.log(f"[{section}] done in {time.perf_counter() - s0:.0f} s")
    settings = {"device": str(device), "threads": args.threads, "sections": ",".join(args.sections),
                "activations": ",".join(args.activations), "compile modes": ",".join(args.compile_modes) or "none",
                "overhead-bound warm-up / timed steps": f"{args.warmup} / {args.steps}",
                "paper size warm-up / timed steps": f"{args.paper_warmup} / {args.paper_steps}",
                "HNN warm-up / timed steps": f"{args.hnn_warmup} / {args.hnn_steps}", "seed": args.seed,
                "TF32 (CUDA)": bool(args.tf32 and device.type == "cuda"),
                "Inductor cache": "empty at start (--cold-compile)" if args.cold_compile else "the user's (may be warm)",
                "fit settings": "library defaults (validation 'first-step', log_every 50, fused Adam), progress off",
                "total seconds": round(time.perf_counter() - t0)}  # fmt: skip
    payload = {"machine": info, "settings": settings, "command": common.command_line(), "results": results}
    stem = args.stem or f"gpu_step_time_{device.type}"
    md_path, json_path = common.write_results(stem, render(info, settings, results, device), payload, args.out_dir)
    common.log(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
