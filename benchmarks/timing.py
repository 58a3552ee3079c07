"""How fast training runs: one script, one section per question (``--section NAME``; several: ``a,b``; ``all``).

Sections, and the result file each writes (``benchmarks/results/<stem>.md`` and ``.json``):

- ``step`` (``step_time``): the invariant MLP at paper 003 size on CPU: ``fit``'s step vs a hand-written PyTorch twin
  of the same ELBO and a plain Pyro step; GFLOP/s against the machine's matmul rate.
- ``gpu`` (``gpu_step_time_<device>``): the same on ``--device`` (CUDA by default) at two sizes and with ``compile``
  modes, each against a twin given the same treatment (eager, ``torch.compile``, one CUDA graph per step), over
  ``--repeats`` fresh runs; the symmetrised HNN (SHO; 3-body at the reference's 1000 pairs per step with the
  closed-form prior update), the layer-wise networks and the JAX reference (``--parts``). Settings fixed before any
  result: MLP parts 20 warm-up + max(200, 2·log_every) timed steps (paper size on a CPU 2 + 2·log_every), HNN
  5 + 2·log_every, layer-wise 10 + 2·log_every. ``--render-speed`` draws the speed table (README, docs/speed.md)
  from result JSON files or a GPU session's folder (``benchmarks/gpu_session.sh``).
- ``layerwise`` (``layerwise_step_time``): the layer-wise networks of paper 004, ``fit`` / ``fit_laplace`` vs a
  torch twin.
- ``noether-flow`` (``noether_flow_step_time``): the symmetrised HNN, ODE-flow vs matrix-exponential symmetry samples.
- ``transform-path`` (``transform_path``): ``InvariantMLP.features`` warping the weight rows or the inputs.
- ``kfac`` (``kfac_update_cost``): one Laplace curvature + δ update, KFAC vs the diagonal GGN, time and memory.
- ``guides`` (``guide_cost``): each guide's ``fit`` step as the invariant MLP grows.
- ``ddp`` (``ddp_throughput``): ``fit`` on 1 process vs 2 data-parallel ranks, the same shards.
- ``particles`` (``hnn_particles``): ELBO particles one after another vs vectorised (Pyro's two estimators).
- ``determinism`` (``gpu_determinism``): do layer-wise MAP / Laplace fits repeat and resume bit for bit (CUDA)?
- ``import`` (``import_time``): ``import pyro_invariance`` in fresh processes vs ``import torch, pyro``.

Our side is always ``pyro_invariance.fit`` (or ``fit_laplace``), timed between its callbacks: step k is the wall time
from the end of callback k−1 to the start of callback k (the whole loop), for the steps after the first (validated)
step and ``--warmup`` more. Other variants (the twins, the plain Pyro step) run one step each inside those callbacks,
in an order that rotates, so load from other jobs on a shared machine hits them alike; on CUDA every interval ends in
a synchronisation. Compare ratios within one run, not absolute times across runs. Each result file's header names its
path, the mode (full, ``--quick`` or ``--smoke``: toy sizes, seconds on CPU, for the tests), the steps, the device,
the machine and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pyro import poutine  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402
from torch import Tensor, nn  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.data.arrays import train_arrays  # noqa: E402
from pyro_invariance.data.quadrant import build_quadrant_dataset  # noqa: E402
from pyro_invariance.infer.fast_step import CapturedLoss, static_matrix_exp  # noqa: E402
from pyro_invariance.infer.kfac_layers import kfac_curvature  # noqa: E402
from pyro_invariance.infer.laplace import diagonal_ggn, gradient_update, mackay_update  # noqa: E402
from pyro_invariance.infer.prior_update import ClosedFormPriorUpdate  # noqa: E402
from pyro_invariance.infer.step_loop import is_factor_parameter  # noqa: E402
from pyro_invariance.infer.training import is_symmetry_parameter, make_deterministic  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402
from pyro_invariance.models.layerwise import LayerwiseNet, make_init_loc_fn  # noqa: E402
from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN  # noqa: E402
from pyro_invariance.symmetry import affine  # noqa: E402


# ------------------------------------------------------------------------------------------------
# Shared machinery: statistics, minibatches, the plain Pyro step, fit timed between its callbacks
# ------------------------------------------------------------------------------------------------
def summary(ts: Sequence[float]) -> dict[str, float]:
    """Median, mean, min, quartiles and count of ``ts`` (``{}`` when empty)."""
    ts = list(ts)
    if not ts:
        return {}
    q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) >= 2 else [ts[0]] * 3
    return dict(median=statistics.median(ts), mean=statistics.fmean(ts), min=min(ts), q1=q[0], q3=q[2], n=len(ts))


def rotated(names: Sequence[str], k: int) -> list[str]:
    names = list(names)
    return names[k % len(names) :] + names[: k % len(names)] if names else []


def interleaved(
    steppers: dict[str, Callable[[], Any]], warmup: int, reps: int, sync: Callable[[], None] = lambda: None
) -> dict[str, list[float]]:
    """Wall time of each call over ``warmup + reps`` rounds (the first ``warmup`` untimed), the order rotating."""
    times: dict[str, list[float]] = {n: [] for n in steppers}
    for rep in range(warmup + reps):
        for name in rotated(list(steppers), rep):
            t0 = time.perf_counter()
            steppers[name]()
            sync()
            if rep >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def sync_of(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


class Shuffler:
    """Minibatch row indices as ``fit`` draws them: a seeded permutation, reshuffled after each pass, copied to the
    device once per pass (a host→device copy per step would synchronise the twin with the host every step)."""

    def __init__(self, n: int, batch: int | None, seed: int, device: torch.device) -> None:
        self.n, self.batch, self.device = n, min(batch or n, n), device
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(n, generator=self.gen).to(device), 0

    def next(self) -> Tensor:
        if self.pos + self.batch > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen).to(self.device), 0
        self.pos += self.batch
        return self.perm[self.pos - self.batch : self.pos]


def adam(groups: list[dict[str, Any]], fused: bool = True, **kw: Any) -> torch.optim.Optimizer:
    """Adam over ``groups``: fused (as ``fit``'s) where torch allows it, else per tensor."""
    with contextlib.suppress(RuntimeError, ValueError, TypeError):
        if fused:
            return torch.optim.Adam(groups, fused=True, **kw)
    return torch.optim.Adam(groups, **kw)


def fit_groups(model: nn.Module, guide: nn.Module, cfg: pi.FitConfig) -> list[dict[str, Any]]:
    """``fit``'s Adam groups and rates, rebuilt from the public predicates ``is_symmetry_parameter`` and
    ``is_factor_parameter``: guide means and scales (``lr``), guide covariance factors (``factor_lr``), the model's
    point estimates (``model_lr``), symmetry parameters η (``eta_lr``)."""
    eta = [p for p in model.parameters() if is_symmetry_parameter(model, p)]
    other = [p for p in model.parameters() if not any(p is e for e in eta)]
    taken = {id(p) for p in eta + other}
    named = [(n, p) for n, p in guide.named_parameters() if id(p) not in taken]
    groups = [
        {"params": [p for n, p in named if not is_factor_parameter(n)], "lr": cfg.lr},
        {"params": [p for n, p in named if is_factor_parameter(n)], "lr": cfg.factor_lr},
        {"params": other, "lr": cfg.model_lr or cfg.lr},
        {"params": eta, "lr": cfg.eta_lr},
    ]
    return [g for g in groups if g["params"]]


def torch_step(
    loss: Callable[[Tensor, Tensor, int], Tensor],
    groups: list[dict[str, Any]],
    case: dict[str, Any],
    total: int,
    seed: int,
    device: torch.device,
) -> Callable[[], None]:
    """One step of a hand-written twin per call: fit's minibatches, fused Adam, cosine schedule, no host reads."""
    optim = adam(groups)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total, eta_min=0.0)
    x_all, y_all = case["x"].to(device), case["y"].to(device)
    rows, n = Shuffler(x_all.shape[0], case["batch"], seed, device), x_all.shape[0]

    def step() -> None:
        idx = rows.next()
        optim.zero_grad(set_to_none=True)
        loss(x_all[idx], y_all[idx], n).backward()
        optim.step()
        sched.step()

    return step


class NoTwin(RuntimeError):
    """The twin-side variant does not exist here (the reason in the message)."""


#: the twin-side treatment that matches each ``compile`` mode of ours (``default``: none passed, the library's)
TWIN_OF_MODE = {"default": "eager", "off": "eager", "auto": "eager", "capture": "eager"}
TWIN_OF_MODE.update(inductor="compiled", cudagraphs="graphed")


def twin_compile(kind: str, device: torch.device) -> str:
    """How the twin's step runs, in words (recorded with every twin variant)."""
    cuda = device.type == "cuda"
    return {
        "eager": "eager, fused Adam",
        "compiled": f"loss under torch.compile ({CapturedLoss.backend}, fullgraph, static shapes"
        + (", reduce-overhead" if cuda else "")
        + "), fused Adam",
        "graphed": "whole step (forward, backward, fused Adam) one CUDA graph",
    }[kind]


def compiled_loss(loss: Callable[[Tensor, Tensor, int], Tensor], device: torch.device) -> Callable[..., Tensor]:
    """``loss`` under ``torch.compile`` with the options of ``fit(compile="inductor")``'s captured loss
    (:class:`~pyro_invariance.infer.fast_step.CapturedLoss`: its backend, ``fullgraph``, static shapes, on CUDA
    ``mode="reduce-overhead"``, i.e. CUDA graphs, with a step mark per call); the optimiser stays eager, as ours."""
    cuda = device.type == "cuda"
    compiled = torch.compile(
        loss,
        backend=CapturedLoss.backend,
        fullgraph=True,
        dynamic=False,
        mode="reduce-overhead" if cuda else None,
    )

    def call(x: Tensor, y: Tensor, n: int) -> Tensor:
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, y, n)

    return call


def graphed_step(
    loss: Callable[[Tensor, Tensor, int], Tensor],
    groups: list[dict[str, Any]],
    case: dict[str, Any],
    total: int,
    seed: int,
    device: torch.device,
) -> Callable[[], None]:
    """The twin's whole step recorded as one CUDA graph (``torch.cuda.graph``): forward, backward and fused Adam
    (``capturable=True``, each group's rate a device tensor). A call copies the next minibatch into the graph's
    static inputs, replays it, and sets the cosine rates in place (outside the graph, no host read)."""
    if device.type != "cuda":
        raise NoTwin("CUDA graphs need a CUDA device (on a CPU fit(compile='cudagraphs') replays the captured graph)")
    base = [float(g["lr"]) for g in groups]
    optim = adam([{**g, "lr": torch.tensor(b, device=device)} for g, b in zip(groups, base)], capturable=True)
    x_all, y_all = case["x"].to(device), case["y"].to(device)
    rows, n = Shuffler(x_all.shape[0], case["batch"], seed, device), x_all.shape[0]
    first = rows.next()
    sx, sy = x_all[first].clone(), y_all[first].clone()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # Adam's state and the libraries' kernel choices made before the recording
        for _ in range(3):
            optim.zero_grad(set_to_none=True)
            loss(sx, sy, n).backward()
            optim.step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optim.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss(sx, sy, n).backward()  # gradients written, not accumulated, on every replay
        optim.step()
    done = [0]

    def step() -> None:
        idx = rows.next()
        sx.copy_(x_all[idx])
        sy.copy_(y_all[idx])
        graph.replay()
        done[0] += 1
        factor = 0.5 * (1.0 + math.cos(math.pi * min(done[0], total) / total))
        for g, b in zip(optim.param_groups, base):
            g["lr"].fill_(b * factor)

    return step


def twin_for(
    mode: str,
    loss: Callable[[Tensor, Tensor, int], Tensor],
    groups: list[dict[str, Any]],
    case: dict[str, Any],
    total: int,
    seed: int,
    device: torch.device,
) -> tuple[Callable[[], None] | None, dict[str, Any]]:
    """The twin's step for our ``compile`` ``mode`` (:data:`TWIN_OF_MODE`) and its record; the compiled twin takes
    one untimed step here, so that its compilation (or failure) happens before ``fit`` starts. ``None`` and the
    reason where the variant does not exist or fails."""
    kind = TWIN_OF_MODE[mode]
    info: dict[str, Any] = {"kind": kind, "compile": twin_compile(kind, device)}
    try:
        if kind == "graphed":
            return graphed_step(loss, groups, case, total, seed, device), info
        step = torch_step(
            compiled_loss(loss, device) if kind == "compiled" else loss, groups, case, total, seed, device
        )
        if kind == "compiled":
            t0 = time.perf_counter()
            step()
            info["compile_seconds"] = time.perf_counter() - t0
        return step, info
    except NoTwin as exc:
        return None, {**info, "skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a compiler or recording failure is reported, not timed
        return None, {**info, "failed": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]}


def machine_load(top: int = 3) -> dict[str, Any]:
    """The 1-min load average and the ``top`` other processes by ``ps``'s %CPU (CPU time over each process's
    lifetime, so a long idle process reads low), this process and its children left out."""
    out: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2), "unix_time": time.time()}
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        ps = subprocess.run(
            ["ps", "-eo", "pid=,ppid=,pcpu=,comm="], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        rows = [line.split(None, 3) for line in ps.splitlines() if len(line.split(None, 3)) == 4]
        me = os.getpid()
        others = [(float(c), name) for pid, ppid, c, name in rows if me not in (int(pid), int(ppid)) and name != "ps"]
        out["top_other_processes"] = [f"{name} {c:.0f}%" for c, name in sorted(others, reverse=True)[:top]]
    return out


def pyro_step(
    case: dict[str, Any],
    total: int,
    seed: int,
    device: torch.device,
    *,
    particles: int = 1,
    vectorise: bool = False,
    validation: bool = True,
) -> Callable[[], float]:
    """One plain Pyro SVI step per call, as a Pyro user writes it: ``TraceMeanField_ELBO.differentiable_loss`` +
    ``backward`` + per-tensor Adam over fit's groups + cosine schedule, with Pyro's validation on, a finiteness check
    and ``loss.item()`` per step (``fit``'s loop before it was made lean)."""
    model, guide = case["model"].to(device), case["guide"].to(device)
    optim = torch.optim.Adam(fit_groups(model, guide, pi.FitConfig.recommended(model, guide)))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total, eta_min=0.0)
    kw = {"vectorize_particles": True, "max_plate_nesting": 1} if vectorise else {}
    elbo = TraceMeanField_ELBO(num_particles=particles, **kw)
    x_all, y_all = case["x"].to(device), case["y"].to(device)
    rows, n = Shuffler(x_all.shape[0], case["batch"], seed, device), x_all.shape[0]

    def step() -> float:
        with pyro.validation_enabled(validation):
            idx = rows.next()
            optim.zero_grad(set_to_none=True)
            loss = elbo.differentiable_loss(model, guide, x_all[idx], y_all[idx], num_data=n)
            if not torch.isfinite(loss):
                raise FloatingPointError("non-finite loss")
            loss.backward()
            optim.step()
            sched.step()
            return loss.item()

    return step


class PeakMemory:
    """CUDA memory allocated above the level at :meth:`start`, at its peak until :meth:`read` (MiB)."""

    def __init__(self, device: torch.device, sync: Callable[[], None]) -> None:
        self.device, self.sync, self.base = device, sync, 0

    def start(self) -> None:
        self.sync()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)

    def read(self) -> float:
        self.sync()
        return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20


def time_fit(
    case: dict[str, Any],
    others: dict[str, Callable[[], Any]],
    warmup: int,
    steps: int,
    seed: int,
    device: torch.device,
    fit_fn: Callable[..., Any] = pi.fit,
    before: Sequence[Callable[..., Any]] = (),
    run_steps: int = 0,
    **fit_kw: Any,
) -> dict[str, Any]:
    """``fit_fn`` for 1 + warmup + steps (+ 1 on CUDA, for the allocator's peak) steps timed between its callbacks,
    one step of each of ``others`` inside each callback; the callbacks ``before`` run first, inside fit's timed
    interval (e.g. a prior update after every step). ``run_steps``: the run's length, if longer (fit's choices may
    depend on it; the steps after the window run untimed). Returns times, their statistics, the paired ratio of
    each to ``twin`` (median over callbacks of its step over the twin's), CUDA peak MiB of the last step, fit's
    ``step_stats``, the compile mode asked for (``default``: none passed), warm-up, timed and run steps."""
    times: dict[str, list[float]] = {"fit": [], **{k: [] for k in others}}
    peaks: dict[str, float] = {}
    first, last = warmup + 2, warmup + steps + 1
    cuda = device.type == "cuda"
    end_step, sync, clock = last + 1 if cuda else last, sync_of(device), {"end": None}
    memory = PeakMemory(device, sync)
    peak, peak_start = memory.read, memory.start

    def callback(step: int, model: Any, guide: Any) -> None:
        if step > end_step:
            return
        sync()
        now = time.perf_counter()
        measure = cuda and step == end_step
        if measure:
            peaks["fit"] = peak()
        if clock["end"] is not None and first <= step <= last:
            times["fit"].append(now - clock["end"])
        for name in rotated(list(others), step):
            if measure:
                peak_start()
            t0 = time.perf_counter()
            others[name]()
            sync()
            if first <= step <= last:
                times[name].append(time.perf_counter() - t0)
            if measure:
                peaks[name] = peak()
        if cuda and step == end_step - 1:
            peak_start()
        sync()
        clock["end"] = time.perf_counter()

    kw = {"steps": max(end_step, run_steps), "progress": False, "seed": seed, "device": str(device)}
    kw.update(callbacks=[*before, callback], **case.get("fit", {}))
    t0 = time.perf_counter()
    result = fit_fn(case["model"], case["guide"], (case["x"], case["y"]), **kw, **fit_kw)
    wall = time.perf_counter() - t0
    paired = {k: summary([a / b for a, b in zip(times[k], times["twin"])]) for k in times} if "twin" in times else {}
    out = dict(times=times, stats={k: summary(v) for k, v in times.items()}, paired_to_twin=paired, peak_mib=peaks)
    out.update(wall_s=wall, step_stats=result.step_stats, warmup=warmup, steps=steps)
    return {**out, "compile": fit_kw.get("compile", "default"), "run_steps": max(end_step, run_steps)}


def make_case(model: Any, guide: str, x: Tensor, y: Tensor, batch: int | None, **guide_kw: Any) -> dict[str, Any]:
    """A timing case: ``model`` and its catalogue ``guide``, set up on the first minibatch of ``x``, ``y`` (all N rows
    counted); ``fit`` runs at that batch size (``None``: full batch). Seed before building ``model``."""
    g, b = guides.get(guide, model, **guide_kw), batch or x.shape[0]
    with poutine.block():
        g(x[:b], y[:b], num_data=x.shape[0])
    return {"model": model, "guide": g, "x": x, "y": y, "batch": batch, "fit": {"batch_size": batch}}


def steps_of(args: argparse.Namespace, full: tuple[int, int], quick: tuple[int, int] | None = None) -> tuple[int, int]:
    """(warm-up, timed) steps: ``--warmup`` / ``--steps`` where given, else the mode's."""
    w, s = {"full": full, "quick": quick or full, "smoke": (1, 2)}[args.mode]
    return (w if args.warmup is None else args.warmup), (s if args.steps is None else args.steps)


def _brief(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['median'] * 1e3:.1f} ms" for k, v in entry["stats"].items() if v)


def _ms(s: dict[str, float] | None, key: str = "median") -> str:
    return f"{s[key] * 1e3:.1f}" if s else "–"


def _mib(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def machine(args: argparse.Namespace) -> dict[str, Any]:
    info = common.machine_info()
    dev = torch.device(args.device)
    info["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({info['cpu']})"
    return info


def verdict(lines: Sequence[str] = ()) -> str:
    """The "Verdict" section every result file ends with: these are timings of this library, no paper's claim."""
    return common.verdict_section("no claim", "a timing of this library; compare ratios within one run", lines)


#: what a section returns: settings, markdown body, JSON payload and (optionally) verdict lines
Published = tuple[Any, ...]


def intro_of(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "")


def section(base: str, title: str) -> Callable[[Callable[..., Published]], Callable[..., Published]]:
    """Mark ``fn`` as a section whose result is published as ``base`` (``{kind}``: the device type) under ``title``,
    its docstring the intro (:func:`run_section`)."""

    def mark(fn: Callable[..., Published]) -> Callable[..., Published]:
        fn.publish_as = (base, title)  # type: ignore[attr-defined]
        return fn

    return mark


def run_section(args: argparse.Namespace, fn: Callable[..., Published]) -> Path:
    base, title = fn.publish_as  # type: ignore[attr-defined]
    kind = torch.device(args.device).type
    return publish(args, base.format(kind=kind), title.format(kind=kind.upper()), intro_of(fn), *fn(args))


def publish(
    args: argparse.Namespace,
    base: str,
    title: str,
    intro: str,
    settings: dict[str, Any],
    body: str,
    payload: dict[str, Any],
    lines: Sequence[str] = (),
) -> Path:
    """Write ``<out-dir>/<stem>.md`` (header: path, mode, device, steps and settings, machine, command; ``body``; the
    verdict with ``lines``) and ``.json``."""
    stem = args.stem or base + {"full": "", "quick": "_quick", "smoke": "_smoke"}[args.mode]
    path = Path(args.out_dir) / f"{stem}.md"
    with contextlib.suppress(ValueError):
        path = path.resolve().relative_to(common.REPO_ROOT)
    settings = {"result file": str(path), "mode": args.mode, "device": args.device, "threads": args.threads, **settings}
    info, command = machine(args), common.command_line()
    md = common.header_markdown(title, info, settings, command, intro) + "\n" + body.rstrip() + "\n\n" + verdict(lines)
    payload = {"machine": info, "settings": settings, "command": command, **payload}
    md_path, _ = common.write_results(stem, md, payload, Path(args.out_dir))
    common.log(f"wrote {md_path}")
    return md_path


# ------------------------------------------------------------------------------------------------
# The invariant MLP: its hand-written twin, cases, and fit timed against the twin (sections step, gpu)
# ------------------------------------------------------------------------------------------------
MLP_SIZES = {
    "paper": {"batch": 128, "samples": 32, "hidden": 1024, "side": 28, "classes": 10, "num_data": 60000},
    "overhead": {"batch": 32, "samples": 4, "hidden": 64, "side": 28, "classes": 10, "num_data": 60000},
    "quick": {"batch": 32, "samples": 4, "hidden": 128, "side": 28, "classes": 10, "num_data": 60000},
    "smoke": {"batch": 8, "samples": 2, "hidden": 16, "side": 8, "classes": 10, "num_data": 64},
}


class InvariantMLPTwin(nn.Module):
    """The invariant MLP + block-Cholesky guide as plain tensors, started from a Pyro pair's parameters.

    Unconstrained parameters mirror the Pyro ones (η = η_max·sigmoid(u); guide scales softplus; unit lower-triangular
    factor tril(U, −1) + I). :meth:`loss` is one reparameterised draw of the negative ELBO in the Pyro guide's and
    model's random-number order: σ_p, W2 (block-Cholesky), b2, then the S transforms; analytic KLs; the categorical
    log-likelihood scaled by N/B; the same transform path (weights or inputs) as the model for the batch size."""

    def __init__(self, model: InvariantMLP, guide: Any) -> None:
        super().__init__()

        def p(t: Tensor) -> nn.Parameter:
            return nn.Parameter(t.detach().clone())

        self.image_shape, self.num_samples, self.activation = model.image_shape, model.num_transforms, model.activation
        self.hidden, self.k, self.sampling = model.hidden, len(model.generator_names), model.sampling
        self.transform_path = model.transform_path
        self.graph_safe = False  # True: exp by static_matrix_exp (no host read), as fit's CUDA-graph path records it
        self.area_changing = bool((model.generators.diagonal(dim1=-2, dim2=-1).sum(-1) != 0).any())
        for name in ("generators", "eta_upper", "prior_scale_loc"):
            self.register_buffer(name, getattr(model, name).clone())
        self.eta_u = p(model.symmetry_parameters()[0])
        if model.activation == "relu":
            self.w1, self.b1 = p(model.w1), p(model.b1)
        else:
            self.register_buffer("w1", model.w1.clone())
            self.register_buffer("b1", model.b1.clone())
        w2 = guide.structured.out_weight
        self.w2_loc, self.w2_scale_u, self.w2_tril = (
            p(w2.loc_unconstrained),
            p(w2.scale_unconstrained),
            p(w2.scale_tril_unconstrained),
        )
        self.b2_loc, self.b2_scale_u = p(guide.locs.out_bias_unconstrained), p(guide.scales.out_bias_unconstrained)
        self.sp_loc = p(guide.locs.prior_scale_unconstrained)
        self.sp_scale_u = p(guide.scales.prior_scale_unconstrained)

    def param_groups(self, cfg: pi.FitConfig) -> list[dict[str, Any]]:
        """The same Adam groups and rates as ``fit``."""
        guide = [self.w2_loc, self.w2_scale_u, self.b2_loc, self.b2_scale_u, self.sp_loc, self.sp_scale_u]
        groups = [{"params": guide, "lr": cfg.lr}, {"params": [self.w2_tril], "lr": cfg.factor_lr}]
        if self.activation == "relu":
            groups.append({"params": [self.w1, self.b1], "lr": cfg.model_lr or cfg.lr})
        return groups + [{"params": [self.eta_u], "lr": cfg.eta_lr}]

    def _phi(self, pre: Tensor) -> Tensor:
        return math.sqrt(2.0 / self.hidden) * torch.cos(pre) if self.activation == "rff" else F.relu(pre)

    def loss(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        """−ELBO estimate on a minibatch ``x`` (B, 1, h, w), ``y`` (B,): one draw."""
        std = {"dtype": x.dtype, "device": x.device}
        sp_scale = F.softplus(self.sp_scale_u)
        sigma = (self.sp_loc + sp_scale * torch.empty((), **std).normal_()).exp()
        C, H = self.w2_loc.shape
        s = F.softplus(self.w2_scale_u)
        chol = s.unsqueeze(-1) * (self.w2_tril.tril(-1) + torch.eye(H, **std))
        w2 = self.w2_loc + (chol @ torch.randn(C, H, **std).unsqueeze(-1)).squeeze(-1)
        b2_scale = F.softplus(self.b2_scale_u)
        b2 = self.b2_loc + b2_scale * torch.empty((C,), **std).normal_()
        x = x.reshape(x.shape[0], -1)
        b, d = x.shape
        eta = self.eta_upper * torch.sigmoid(self.eta_u)
        eps = affine.sample_epsilon(self.num_samples, self.k, self.sampling, **std)
        algebra = torch.einsum("sk,kij->sij", eps * eta, self.generators)  # affine.lie_exp's exponent
        transforms = static_matrix_exp(algebra) if self.graph_safe else torch.linalg.matrix_exp(algebra)
        if self.transform_path(b) == "weights":  # warp the S·H rows of W1 (paper 003, Eq. 6)
            rows = affine.transform_weight_rows(self.w1, transforms, self.image_shape, layout="hsd")  # (H, S, D)
            pre = F.linear(x, rows.reshape(-1, d)).view(b, self.hidden, -1) + self.b1.unsqueeze(-1)  # (B, H, S)
            features = self._phi(pre).mean(-1)
        else:  # warp the S·B inputs by T_s⁻¹ (times |det T_s|⁻¹)
            inverse = affine.invert_affine(transforms)
            warped = affine.warp_stack(x.reshape(b, *self.image_shape), inverse).reshape(b, -1, d)  # (B, S, D)
            if self.area_changing:
                warped = warped * affine.affine_det(inverse).unsqueeze(-1)
            features = self._phi(F.linear(warped, self.w1, self.b1)).mean(1)
        nll = F.cross_entropy(features @ w2.T + b2, y, reduction="sum") * (num_data / b)
        kl_sigma = -torch.log(sp_scale) + 0.5 * (sp_scale**2 + (self.sp_loc - self.prior_scale_loc) ** 2) - 0.5
        kl_w2 = 0.5 * (
            ((chol.pow(2).sum(-1) + self.w2_loc**2) / sigma**2).sum()
            - C * H
            + C * H * torch.log(sigma**2)
            - 2.0 * torch.log(s).sum()
        )
        kl_b2 = (torch.log(sigma / b2_scale) + (b2_scale**2 + self.b2_loc**2) / (2 * sigma**2) - 0.5).sum()
        return nll + kl_sigma + kl_w2 + kl_b2


def mlp_case(cfg: dict[str, int], activation: str, seed: int) -> dict[str, Any]:
    """Model (rotation learned), block-Cholesky guide set up on one minibatch, which is tiled to N rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(cfg["batch"], 1, cfg["side"], cfg["side"], generator=gen)
    y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen)
    pyro.set_rng_seed(seed)
    model = InvariantMLP(
        image_shape=(1, cfg["side"], cfg["side"]),
        num_classes=cfg["classes"],
        hidden=cfg["hidden"],
        activation=activation,
        symmetry="rotation",
        learn_symmetry=True,
        num_transforms=cfg["samples"],
    )
    n, b = cfg["num_data"], cfg["batch"]
    return make_case(model, "block-cholesky", x.repeat(-(-n // b), 1, 1, 1)[:n], y.repeat(-(-n // b))[:n], b)


def check_same_elbo(case: dict[str, Any], twin: InvariantMLPTwin, seed: int) -> dict[str, float]:
    """Same parameters, same seed: Pyro's loss and gradients vs the twin's (relative differences)."""
    model, guide, n = case["model"], case["guide"], case["x"].shape[0]
    x, y = case["x"][: case["batch"]], case["y"][: case["batch"]]
    with pyro.validation_enabled(True):
        pyro.set_rng_seed(seed)
        loss_p = TraceMeanField_ELBO().differentiable_loss(model, guide, x, y, num_data=n)
    loss_p.backward()
    pyro.set_rng_seed(seed)
    loss_h = twin.loss(x, y, n)
    loss_h.backward()
    pairs = {
        "eta": (model.symmetry_parameters()[0], twin.eta_u),
        "W2 loc": (guide.structured.out_weight.loc_unconstrained, twin.w2_loc),
        "sigma_p loc": (guide.locs.prior_scale_unconstrained, twin.sp_loc),
    }
    lp, lh = loss_p.item(), loss_h.item()
    out = {"loss_pyro": lp, "loss_hand": lh, "loss_rel_diff": abs(1 - lh / lp)}
    for name, (a, b) in pairs.items():
        out[f"grad_rel_diff[{name}]"] = float((a.grad - b.grad).norm() / a.grad.norm().clamp_min(1e-30))
    for module in (model, guide, twin):
        module.zero_grad(set_to_none=True)
    return out


def mlp_run(
    args: argparse.Namespace, cfg: dict[str, int], act: str, mode: str, warmup: int, steps: int, pyro_too: bool
) -> dict[str, Any]:
    """One fresh ``fit(compile=mode)`` (``default``: no ``compile`` passed, and a run of the library's default
    length, ``--fit-steps``, timed over its window) with the twin of that mode (:func:`twin_for`) and, with
    ``pyro_too``, the plain Pyro step interleaved in its callbacks; each variant's transform path and compile mode
    recorded under ``variants``."""
    device, total, seed = torch.device(args.device), warmup + steps + 3, args.seed
    case = mlp_case(cfg, act, seed)
    twin = InvariantMLPTwin(case["model"], case["guide"]).to(device)
    twin.graph_safe = TWIN_OF_MODE[mode] == "graphed"
    step, info = twin_for(mode, twin.loss, twin.param_groups(pi.FitConfig()), case, total, seed, device)
    others: dict[str, Callable[[], Any]] = {"twin": step} if step else {}
    if pyro_too and mode == "default":
        others["pyro"] = pyro_step(mlp_case(cfg, act, seed), total, seed, device)
    path = case["model"].transform_path(cfg["batch"])
    length = fit_length(args) if mode == "default" else 0
    entry = time_fit(case, others, warmup, steps, seed, device, run_steps=length, **_compile(mode), **_tf32(args))
    entry["variants"] = {"fit": {"path": path, "compile": mode}, "twin": {"path": path, **info}}
    if pyro_too and mode == "default":
        entry["variants"]["pyro"] = {"path": path, "compile": "eager Pyro, per-tensor Adam, a host read per step"}
    return entry


def run_mlp(
    args: argparse.Namespace, cfg: dict[str, int], warmup: int, steps: int, check: bool, pyro_too: bool = False
) -> dict[str, Any]:
    """Per activation: ``--repeats`` rounds, each a fresh ``fit`` per compile mode (the order rotating by round)
    with the matching twin interleaved (:func:`mlp_run`); per mode the paired fit / twin ratio of each round and
    their median."""
    out: dict[str, Any] = {"sizes": cfg, "activations": {}, "repeats": args.repeats}
    modes = ["default"] * (not args.skip_default) + args.compile_modes
    for act in args.activations:
        reps: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for r in range(args.repeats):
            for mode in rotated(modes, r):
                reps[mode].append(mlp_run(args, cfg, act, mode, warmup, steps, pyro_too))
                common.log(f"[mlp {act}, compile {mode}, repetition {r + 1}] {_brief(reps[mode][-1])}")
        runs = {("fit" if m == "default" else f"fit-{m}"): combine(reps[m]) for m in modes}
        if check and "fit" in runs:
            fresh = mlp_case(cfg, act, args.seed)
            runs["fit"]["check"] = check_same_elbo(fresh, InvariantMLPTwin(fresh["model"], fresh["guide"]), args.seed)
        out["activations"][act] = runs
    return out


def _compile(mode: str) -> dict[str, str]:
    """``fit``'s ``compile`` keyword for a mode of ours: none for ``default`` (the library's own choice)."""
    return {} if mode == "default" else {"compile": mode}


def fit_length(args: argparse.Namespace) -> int:
    """The length of the ``default`` MLP runs: ``--fit-steps``, else the library's default (``FitConfig().steps``),
    as a user's run; the smoke runs are as short as their window."""
    if args.mode == "smoke":
        return 0
    return args.fit_steps if args.fit_steps is not None else pi.FitConfig().steps


def combine(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Repetitions of one run: each one's paired fit / twin ratio and their median (``None`` without a twin)."""
    ratios = [e["paired_to_twin"]["fit"]["median"] for e in reps if e["paired_to_twin"].get("fit")]
    return {"reps": reps, "ratio_per_repetition": ratios, "ratio": statistics.median(ratios) if ratios else None}


def _tf32(args: argparse.Namespace) -> dict[str, Any]:
    return {"tf32": True} if args.tf32 and torch.device(args.device).type == "cuda" else {}


def _cells(st: dict[str, float]) -> list[str]:
    """Median, mean and interquartile range (ms) of a :func:`summary`: the first columns of every timing table."""
    return [_ms(st), _ms(st, "mean"), f"{_ms(st, 'q1')}–{_ms(st, 'q3')}"]


MLP_HEADER = (
    "act. | run | variant | transform path | compile | median ms | mean ms | IQR ms "
    "| fit / twin, paired (median of repetitions) | each repetition | peak MiB"
)


def variant_compile(entry: dict[str, Any], name: str) -> str:
    """A variant's compile mode as recorded; for ``fit`` the mode asked for and, if it fell back, what ran."""
    info = entry.get("variants", {}).get(name, {})
    if name != "fit":
        why = info.get("skipped") or info.get("failed")
        return info.get("compile", "–") + (f" — not run: {why}" if why else "")
    ss = entry.get("step_stats", {})
    ran, asked, why = ss.get("compile"), entry.get("compile", "default"), ss.get("auto")
    return f"`{asked}`" + (f" (ran `{ran}`" + (f": {why}" if why else "") + ")" if ran and ran != asked else "")


def mlp_rows(act: str, run_name: str, run: dict[str, Any], rate: Callable[[float], list[str]]) -> list[list[Any]]:
    """Table rows of one run: every variant's times pooled over the repetitions; the ratio on the ``fit`` row."""
    reps, rows = run["reps"], []
    names = list(dict.fromkeys([*reps[0]["stats"], *reps[0].get("variants", {})]))
    for name in names:
        st = summary([t for e in reps for t in e["times"].get(name, [])])
        label = run_name if name == "fit" else f"{name} (in {run_name})"
        ratio = ["–", "–"]
        if name == "fit" and run.get("ratio") is not None:
            ratio = [f"{run['ratio']:.2f}×", ", ".join(f"{r:.2f}" for r in run["ratio_per_repetition"])]
        path = reps[0].get("variants", {}).get(name, {}).get("path", "–")
        cells = _cells(st) if st else ["–"] * 3
        peak = _mib(reps[0]["peak_mib"].get(name))
        rows.append([act.upper(), f"`{run_name}`", f"`{label}`", path, variant_compile(reps[0], name), *cells])
        rows[-1] += [*ratio, peak, *(rate(st["median"]) if st else [])]
    return rows


def render_mlp(res: dict[str, Any], flops: float = 0, matmul: float = 1) -> tuple[list[str], list[str]]:
    """Tables of an invariant-MLP result (per activation: every run's variants) and verdict lines."""
    out, found = [], []

    def rate(seconds: float) -> list[str]:
        return [f"{flops / seconds / 1e9:.1f} ({100 * flops / seconds / 1e9 / matmul:.0f}%)"] if flops else []

    for act, runs in res["activations"].items():
        rows = []
        for run_name, run in runs.items():
            rows += mlp_rows(act, run_name, run, rate)
            ss = run["reps"][0].get("step_stats", {})
            if ss.get("capture_seconds") is not None:  # a run that captured its loss (the default may; off never)
                note = f"capture {ss['capture_seconds']:.1f} s"
                note += f", compile {ss['compile_seconds']:.1f} s" if ss.get("compile_seconds") else ""
                rows.append([act.upper(), f"`{run_name}`", "first lean step", *[""] * 5, note, "", ""])
                rows[-1] += [""] * bool(flops)
            if run.get("ratio") is not None:
                twin = run["reps"][0]["variants"]["twin"]["compile"]
                found.append(
                    f"- {act.upper()}, `{run_name}` ({run['reps'][0]['variants']['fit']['path']} path) / twin "
                    f"({twin}) = {run['ratio']:.2f}×, paired, median of {len(run['reps'])} repetition(s)"
                    + _fell_back(run["reps"][0])
                    + "."
                )
        out += [common.md_table(MLP_HEADER + " | GFLOP/s (of matmul rate)" * bool(flops), rows), ""]
        if checks := runs.get("fit", {}).get("check", {}):
            same = ", ".join(f"{k} {v:.3g}" for k, v in checks.items())
            out += [f"Same ELBO (same parameters and seed, relative differences): {same}", ""]
    return out, found


def _fell_back(entry: dict[str, Any]) -> str:
    why = entry.get("step_stats", {}).get("fallback")
    return f" (fell back to `{entry['step_stats'].get('compile')}`: {why}; not a compiled number)" if why else ""


@section("step_time", "SVI step time of InvariantMLP: fit vs hand-written PyTorch")
def section_step(args: argparse.Namespace) -> Published:
    """The invariant MLP of paper 003 (rotation learned, block-Cholesky guide): `fit`'s own loop, with a hand-written
    PyTorch twin of the same ELBO (`twin`: same transforms, one reparameterised draw, analytic KLs, fit's Adam groups,
    fused) and a plain Pyro step (`pyro`: validation on, per-tensor Adam, a host read per step; its time shown, no
    ratio: it is the loop as it was, not a like-for-like side) interleaved in its callbacks. GFLOP/s counts only
    4·B·S·H·D."""
    cfg = MLP_SIZES[{"full": "paper", "quick": "quick", "smoke": "smoke"}[args.mode]]
    warmup, steps = steps_of(args, (3, 25), (2, 10))
    B, S, H, D = cfg["batch"], cfg["samples"], cfg["hidden"], cfg["side"] ** 2
    flops = 4 * B * S * H * D  # x·W1^(s)ᵀ forward 2·B·S·H·D and its backward to the warped rows 2·B·S·H·D
    matmul = common.matmul_gflops(256 if args.mode == "smoke" else 2048)
    res = run_mlp(args, cfg, warmup, steps, check=True, pyro_too=True)
    tables, lines = render_mlp(res, flops, matmul)
    rate = f"Measured float32 matmul rate ({args.threads} thread(s)): **{matmul:.1f} GFLOP/s**."
    body = "\n".join([rate, "", "## Time per step", "", *tables])
    settings = {
        "sizes": cfg,
        "warm-up / timed steps": f"{warmup} / {steps}",
        "activations": args.activations,
        "compile modes": ["default", *args.compile_modes],
        "default run length": fit_length(args),
        "dominant FLOPs per step (4·B·S·H·D)": flops,
    }
    return settings, body, {"matmul_gflops": matmul, "flops_per_step": flops, "results": res}, lines


# ------------------------------------------------------------------------------------------------
# The symmetrised HNN, the JAX reference and the GPU report (section gpu)
# ------------------------------------------------------------------------------------------------
#: the symmetrised HNN at the reference's SHO and 3-body settings, and a toy size
HNN_KEYS = "state_dim hidden num_generators num_transforms euler_steps dt sampling batch num_data particles".split()
HNN = {
    "hnn-sho": {
        **dict(zip(HNN_KEYS, (2, (200, 200), 1, 200, 20, 0.2, "cube", 28, 28, (20, 1)))),
        "prior": "fixed",
        "eta_init_std": 0.0,  # the reference's --conserved_init_std default (table1.sh does not set it)
    },
    # the reference's batch counts trajectories: 20 trajectories × 50 steps = 1000 pairs of 200 × 50 = 10 000
    "hnn-3body": {
        **dict(zip(HNN_KEYS, (12, (250, 250, 250), 10, 100, 10, 1.0, "ball", 1000, 10000, (2,)))),
        "prior": "closed-form",  # updated after every step (ClosedFormPriorUpdate), as the reference's recipe
        "elu_alpha": 1.0,  # the reference's --act_fun elu (the SHO's elu2 is the model's default α = 2)
    },
    "smoke": dict(zip(HNN_KEYS, (2, (8, 8), 1, 3, 2, 0.2, "cube", 6, 12, (1, 2)))),
}
#: fit's steps between bulk reads of the loss: timed windows span at least two
LOG_EVERY = pi.FitConfig().log_every
#: the JAX reference's command lines for the same two systems (its scripts/harmonic-oscillator/table1.sh and
#: scripts/nbody/table3.sh; the learned lines add reference_step.LEARNED_GROUP), kept with the script timing its step
from reference_step import REFERENCE_ARGS, VARIANTS, compare_settings  # noqa: E402

GPU_PARTS = ("mlp-overhead", "mlp-paper", "hnn-sho", "hnn-3body", "layerwise", "reference")


def hnn_case(
    h: dict[str, Any], seed: int, particles: int, symmetry: str = "quadratic", closed_form: bool = False
) -> dict[str, Any]:
    """The symmetrised HNN (``symmetry``: quadratic, or none for the plain HNN) with its matrix-normal guide set up;
    ``h["num_data"]`` random pairs in minibatches of ``h["batch"]``; ``closed_form``: ``prior="closed-form"``, whose
    variances :class:`ClosedFormPriorUpdate` sets."""
    pyro.set_rng_seed(seed)
    kw = {"num_generators": h["num_generators"], "sampling": h["sampling"]} if symmetry != "none" else {}
    if symmetry != "none" and "eta_init_std" in h:
        kw["eta_init_std"] = h["eta_init_std"]
    if "elu_alpha" in h:
        kw["elu_alpha"] = h["elu_alpha"]
    model = SymmetrisedHNN(
        h["state_dim"],
        h["hidden"],
        symmetry=symmetry,
        num_transforms=h["num_transforms"],
        euler_steps=h["euler_steps"],
        dt=h["dt"],
        prior="closed-form" if closed_form else "fixed",
        **kw,
    )
    gen = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(h["num_data"], h["state_dim"], generator=gen) for _ in range(2))
    batch = None if h["batch"] >= h["num_data"] else h["batch"]
    case = make_case(model, "matrix-normal", x, y, batch, init_scale=0.01)
    return {**case, "fit": {"batch_size": batch, "num_particles": particles}}


def run_hnn(args: argparse.Namespace, part: str) -> dict[str, Any]:
    """Per number of weight samples and compile mode, one fresh ``fit`` (no twin: the other side is the JAX
    reference's jitted step, timed in its own process); the SHO part also the plain HNN (no symmetry) at the first
    number of samples; the 3-body part at the reference's batch with the closed-form prior update after every step
    inside the timed interval (as ``benchmarks/threebody_recipe.py`` runs it)."""
    h = HNN["smoke" if args.mode == "smoke" else part]
    device, seed, closed = torch.device(args.device), args.seed, part == "hnn-3body"
    warmup, steps = steps_of(args, (5, 2 * LOG_EVERY), (2, 10))
    out: dict[str, Any] = {"settings": {**h, "prior": "closed-form, updated every step" if closed else "fixed"}}
    out["settings"]["batch"] = min(h["batch"], h["num_data"])
    particles = args.sho_particles if part == "hnn-sho" and args.sho_particles else h["particles"]
    runs = [(p, mode, "quadratic") for p in particles for mode in ["default", *args.compile_modes]]
    runs += [(particles[0], "default", "none")] if part == "hnn-sho" else []
    out["particles"] = {}
    for p, mode, symmetry in runs:
        before = [ClosedFormPriorUpdate(0.5)] if closed else []
        case = hnn_case(h, seed, p, symmetry, closed)
        entry = time_fit(case, {}, warmup, steps, seed, device, before=before, **_compile(mode), **_tf32(args))
        entry["variants"] = {"fit": {"path": "–", "compile": mode, "symmetry": symmetry, "prior update": closed}}
        key = str(p) + ("" if mode == "default" else f" ({mode})") + (" plain HNN" if symmetry == "none" else "")
        out["particles"][key] = entry
        common.log(f"[{part}] {key}: {_brief(entry)}")
    return out


REFERENCE_SCRIPT = Path(__file__).resolve().with_name("reference_step.py")


def reference_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the reference's process: JAX on the CPU (one thread where ``--threads 1``), or on the GPU
    beside this process's torch without claiming most of its memory up front."""
    env = dict(os.environ)
    if args.device == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        if args.threads == 1:
            one = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {one}".strip()
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def run_reference(args: argparse.Namespace) -> dict[str, Any]:
    """The JAX reference's (tychovdo/noethers-razor) training step timed alone, per system and variant (``hnn-sho``
    learned symmetry, ``hnn-sho-plain`` its plain HNN, ...): ``benchmarks/reference_step.py`` in a process of its own
    (this interpreter, which then needs JAX): its jitted −ELBO, gradients and optimiser update, compiled first, then
    at least 20 steps each ended by ``block_until_ready``. Every variant compiles at once; with ``--reference-go``
    they then wait until that file exists (``gpu_session.sh`` creates it when its torch parts are done), and their
    steps run one variant after another, nothing else on the device. Each entry is that script's JSON line with
    ``s_per_step`` (the median step) and ``mismatch``: where our side's settings (``HNN`` and the model's defaults)
    differ."""
    ref = Path(args.reference_dir) if args.reference_dir else None
    if ref is None or not (ref / "main.py").exists():
        return {"skipped": "no --reference-dir with the reference's main.py (a checkout of tychovdo/noethers-razor)"}
    smoke, (warmup, steps) = args.mode == "smoke", steps_of(args, (2, 20))
    steps = steps if smoke else max(steps, 20)
    if args.device != "cpu":
        torch.cuda.empty_cache()
    systems = [p for p in args.reference_systems or args.parts if p in REFERENCE_ARGS]
    names = {(p, v): p if v == "learned" else f"{p}-plain" for p in systems for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}  # every variant compiles at once; their steps then run one after another, alone
        for (part, variant), name in names.items():
            cmd = [sys.executable, str(REFERENCE_SCRIPT), "--reference-dir", str(ref), "--system", part]
            cmd += ["--variant", variant, "--warmup", str(warmup), "--steps", str(steps)]
            cmd += ["--smoke"] * smoke + ["--ready-file", f"{tmp}/{name}.ready", "--go-file", f"{tmp}/{name}.go"]
            log = open(f"{tmp}/{name}.err", "w")  # noqa: SIM115 - closed after the process ends
            procs[name] = (cmd, log, subprocess.Popen(cmd, env=reference_env(args), stdout=subprocess.PIPE, stderr=log))
        wait_for_reference_go(args, procs, tmp)
        out = {
            name: reference_result(procs[name], tmp, name, smoke, part, variant)
            for (part, variant), name in names.items()
        }
    return out


def wait_for_reference_go(args: argparse.Namespace, procs: dict[str, Any], tmp: str) -> None:
    """Until every reference process has compiled (or ended), then until ``--reference-go`` exists (where given)."""
    t0 = time.perf_counter()
    while any(p.poll() is None and not Path(tmp, f"{n}.ready").exists() for n, (_, _, p) in procs.items()):
        time.sleep(0.5)
    common.log(f"[reference] compiled in {time.perf_counter() - t0:.0f} s")
    while args.reference_go is not None and not Path(args.reference_go).exists():
        time.sleep(0.5)


def reference_result(proc: tuple, tmp: str, name: str, smoke: bool, part: str, variant: str) -> dict[str, Any]:
    """Release one compiled reference process (its go file), wait for it and read its JSON line."""
    cmd, log, p = proc
    Path(tmp, f"{name}.go").touch()
    stdout = p.communicate()[0].decode()
    log.close()
    lines = stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        err = Path(tmp, f"{name}.err").read_text().strip().splitlines() or ["?"]
        common.log(f"[reference] {name}: {err[-1]}")
        return {"error": err[-1], "command": shlex.join(cmd)}
    res = json.loads(lines[-1])
    defaults = inspect.signature(SymmetrisedHNN).parameters  # what hnn_case leaves to the model
    ours = {k: defaults[k].default for k in ("elu_alpha", "eta_init_std", "prior")}
    mismatch = None if smoke else compare_settings({**ours, **HNN[part]}, res["settings"], variant)
    common.log(f"[reference] {name}: compile {res['compile_s']:.1f} s, median {res['median_s'] * 1e3:.1f} ms")
    return {**res, "s_per_step": res["median_s"], "mismatch": mismatch, "command": shlex.join(cmd)}


def reference_step(reference: dict[str, Any], system: str) -> float | None:
    """Seconds per step of the JAX reference's jitted step for ``system`` (``hnn-sho``; ``hnn-sho-plain``: its plain
    HNN), from ``run_reference``'s entry ``reference[system]`` or ``reference[base][variant]`` (``learned`` /
    ``plain``), its ``s_per_step`` or ``median_s``; ``None`` where it was not timed."""
    base, variant = (system.removesuffix("-plain"), "plain") if system.endswith("-plain") else (system, "learned")
    entry = reference.get(system)
    if not (isinstance(entry, dict) and ({"s_per_step", "median_s"} & set(entry))):
        nested = reference.get(base)
        entry = nested.get(variant) if isinstance(nested, dict) else None
    return (entry.get("s_per_step") or entry.get("median_s")) if isinstance(entry, dict) else None


def reference_samples(system: str) -> int | None:
    """The JAX reference's number of weight samples (``--mc_samples``) for ``system``."""
    args = REFERENCE_ARGS.get(system.removesuffix("-plain"), [])
    return int(args[args.index("--mc_samples") + 1]) if "--mc_samples" in args else None


def hnn_reference_pairs(part: str, res: dict[str, Any]) -> list[tuple[str, str]]:
    """(our row, the reference's system) for the rows at the reference's number of weight samples."""
    samples, pairs = reference_samples(part), []
    for key in res["particles"]:
        if samples is not None and int(key.split()[0]) == samples:
            pairs.append((key, part + "-plain" if key.endswith("plain HNN") else part))
    return pairs


def render_hnn(part: str, res: dict[str, Any], reference: dict[str, Any]) -> tuple[list[str], list[str]]:
    h, rows, found = res["settings"], [], []
    for key, entry in res["particles"].items():
        for name, st in entry["stats"].items():
            if st:
                cells = [key, f"`{name}`", variant_compile(entry, name), *_cells(st), st["n"], entry["warmup"]]
                rows.append([*cells, _mib(entry["peak_mib"].get(name))])
    for key, system in hnn_reference_pairs(part, res):
        ref, fit = reference_step(reference, system), res["particles"][key]["stats"]["fit"]
        if ref:
            found.append(
                f"- {part}, {key} weight samples: fit / the JAX reference's jitted step ({ref * 1e3:.1f} ms, "
                f"`{system}`) = {fit['median'] / ref:.2f}× (ratio of medians){_fell_back(res['particles'][key])}."
            )
    title = (
        f"## Symmetrised HNN, {part.split('-')[1]} (hidden {h['hidden']}, S = {h['num_transforms']}, "
        f"E = {h['euler_steps']}, K = {h['num_generators']}, {h['batch']} pairs per step of {h['num_data']}, "
        f"prior {h['prior']})"
    )
    head = "weight samples | variant | compile | median ms | mean ms | IQR ms | timed steps | warm-up | peak MiB"
    return [title, "", common.md_table(head, rows), ""], found


def part_note(meta: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """One line per part: the machine's load before and after it, and its overlap with the JAX reference's run."""
    if not meta:
        return ""
    before, after = meta.get("load_before", {}), meta.get("load_after", {})
    text = f"Machine load (1-min average): {before.get('load_1min')} before, {after.get('load_1min')} after"
    if others := before.get("top_other_processes"):
        text += f"; other processes by `ps` %CPU before: {', '.join(others)}"
    if reference and reference is not meta and (span := reference.get("interval")):
        (a, b), (c, d) = meta["interval"], span
        text += f"; overlap with the JAX reference's run: {max(0.0, min(b, d) - max(a, c)):.0f} s of {b - a:.0f} s"
    return text + "."


def render_gpu(results: dict[str, Any], device: str) -> tuple[str, list[str]]:
    """The tables of a ``gpu`` result, and its verdict lines."""
    out, lines, meta = [], [], results.get("meta", {})
    ref_meta = meta.get("reference")
    for part in ("mlp-overhead", "mlp-paper"):
        if part in results:
            c, e = results[part]["sizes"], first_entry(results[part])
            out += [
                f"## Invariant MLP, {part.split('-')[1]} size (B = {c['batch']}, S = {c['samples']}, "
                f"H = {c['hidden']}, {c['side']}×{c['side']}, N = {c['num_data']})",
                "",
                f"Timed steps {e['steps']} after {e['warmup']} warm-up steps (and the first, validated, step), "
                f"{results[part].get('repeats', 1)} repetition(s). {part_note(meta.get(part, {}), ref_meta)}",
                "",
            ]
            tables, found = render_mlp(results[part])
            out += tables
            lines += [f"- {part.split('-')[1]} size," + v[1:] for v in found]
    for part in ("hnn-sho", "hnn-3body"):
        if part in results:
            tables, found = render_hnn(part, results[part], results.get("reference", {}))
            out += [*tables[:2], part_note(meta.get(part, {}), ref_meta), "", *tables[2:]]
            lines += found
    if "layerwise" in results:
        out += [render_layerwise(results["layerwise"].get("rows", [])), part_note(meta.get("layerwise", {}), ref_meta)]
    if "reference" in results:
        out += ["", render_reference(results["reference"], meta.get("reference", {}))]
    return "\n".join(out), lines


def first_entry(res: dict[str, Any]) -> dict[str, Any]:
    run = next(iter(next(iter(res["activations"].values())).values()))
    return run["reps"][0]


def render_reference(ref: dict[str, Any], meta: dict[str, Any]) -> str:
    systems = [f"{p}{v}" for p in REFERENCE_ARGS for v in ("", "-plain")]
    rows = [[s, _x(1e3 * t, "") if (t := reference_step(ref, s)) else "–"] for s in systems]
    head = "## JAX reference (tychovdo/noethers-razor)\n\n"
    if "skipped" in ref:
        return head + f"Not run: {ref['skipped']}.\n"
    where = " (in the background while the torch parts ran)" if meta.get("background") else ""
    return head + f"Run{where}. {part_note(meta, None)}\n\n" + common.md_table("system | ms/step", rows) + "\n"


GPU_TITLE = "Training step time on {kind}: fit's loop vs an equally optimised hand-written twin"
#: the parts compared with the JAX reference run after it (its timed steps on a machine otherwise idle)
AFTER_REFERENCE = ("hnn-sho", "hnn-3body")


def gpu_part(args: argparse.Namespace, part: str) -> dict[str, Any]:
    if part.startswith("mlp-"):
        cfg = MLP_SIZES["smoke" if args.mode == "smoke" else part.split("-")[1]]
        return run_mlp(args, cfg, *steps_of(args, mlp_steps(args, part)), check=False)
    if part.startswith("hnn-"):
        return run_hnn(args, part)
    if part == "layerwise":
        return {"alpha": layerwise_size(args)["alpha"], "rows": measure_layerwise(args, (10, 2 * LOG_EVERY))}
    return run_reference(args)


def mlp_steps(args: argparse.Namespace, part: str) -> tuple[int, int]:
    """(warm-up, timed) steps of an MLP part: at least 200 and two bulk reads (2·log_every) in the window; the
    paper size on a CPU 2·log_every (about a second a step)."""
    timed = max(200, 2 * LOG_EVERY)
    return (2, 2 * LOG_EVERY) if part == "mlp-paper" and args.device == "cpu" else (20, timed)


def timed_part(args: argparse.Namespace, part: str, results: dict[str, Any], background: bool = False) -> None:
    """``results[part]`` and ``results["meta"][part]``: its interval (Unix seconds) and the load around it."""
    meta = {"load_before": machine_load(), "background": background}
    t0 = time.time()
    results[part] = gpu_part(args, part)
    meta.update(interval=[t0, time.time()], load_after=machine_load())
    results["meta"][part] = meta
    common.log(f"[{part}] done in {meta['interval'][1] - t0:.0f} s")


@section("gpu_step_time_{kind}", GPU_TITLE)
def section_gpu(args: argparse.Namespace) -> Published:
    """Every `fit` row is `pyro_invariance.fit`'s own loop with library defaults, timed between its callbacks; the
    twin (a hand-written PyTorch step of the same ELBO: fused Adam, no host reads, the model's transform path, the
    minibatch indices copied to the device once per pass as fit's) runs one step inside each of those callbacks,
    interleaved, and is given our compile mode's treatment: `fit` and `fit-capture` against the eager twin
    (capturing removes Pyro's Python per step; the twin is already pure torch, so it has no other analogue),
    `fit-inductor` against the twin's loss under `torch.compile` with fit's options, `fit-cudagraphs` against the
    twin's whole step (forward, backward, fused Adam) recorded as one CUDA graph. Ratios are paired (per
    callback), the median over callbacks, and over `--repeats` fresh runs. The symmetrised HNN is compared with
    the JAX reference's jitted step (its own process, started first, in the background). Compare ratios within a
    run, not absolute times across runs."""
    results: dict[str, Any] = {"meta": {}}
    parts, thread = list(args.parts), None
    if "reference" in parts and len(parts) > 1:  # the reference compiles on the host while the torch parts run
        parts.remove("reference")
        thread = threading.Thread(target=timed_part, args=(args, "reference", results, True), daemon=True)
        thread.start()
    for part in [p for p in parts if p not in AFTER_REFERENCE] + [p for p in parts if p in AFTER_REFERENCE]:
        if part in AFTER_REFERENCE and thread is not None:
            thread.join()
        timed_part(args, part, results)
    if thread is not None:
        thread.join()
    settings = {
        "parts": ",".join(args.parts),
        "activations": ",".join(args.activations),
        "compile modes": ",".join(args.compile_modes) or "none",
        "repetitions (MLP parts)": args.repeats,
        "length of the default-mode MLP runs (timed over their window)": fit_length(args) or "the window",
        "warm-up / timed steps": f"{args.warmup} / {args.steps} (None: each part's default, in its table)",
        "fit's log_every": LOG_EVERY,
        "seed": args.seed,
        "TF32 (CUDA)": bool(_tf32(args)),
        "fit settings": "library defaults, progress off",
    }
    body, lines = render_gpu(results, args.device)
    return settings, body, {"results": results}, lines


SPEED_HEADER = (
    "comparison | ours (variant, path, compile) | the other side (variant) | ratio | device | date | result file"
)


def speed_files(paths: Sequence[Path]) -> list[Path]:
    """The ``gpu`` section's JSON files among ``paths`` (a folder: every such JSON in it)."""
    found = [f for p in paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    return [f for f in found if "gpu_step_time" in f.name or "results" in json.loads(f.read_text())]


def _shown(path: Path) -> str:
    """A result file's path from the repository's root, or its folder and name."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(common.REPO_ROOT))
    return f"{path.parent.name}/{path.name}"


def mlp_speed_rows(part: str, res: dict[str, Any]) -> list[list[str]]:
    c, rows = res["sizes"], []
    what = f"invariant MLP, {part.split('-')[1]} size (B {c['batch']}, S {c['samples']}, H {c['hidden']})"
    for act, runs in res["activations"].items():
        for run_name, run in runs.items():
            e = run["reps"][0]
            ours = f"`{run_name}` ({e['variants']['fit']['path']} path, compile {variant_compile(e, 'fit')})"
            ratio = f"{run['ratio']:.2f}× (paired, median of {len(run['reps'])})" if run["ratio"] else "not run"
            rows.append([f"{what}, {act.upper()}", ours, f"hand-written twin: {variant_compile(e, 'twin')}", ratio])
            rows[-1][3] += _fell_back(e)
    return rows


def layerwise_speed_rows(res: dict[str, Any]) -> list[list[str]]:
    """MAP rows only: the twin has no Laplace update, so ``fit-laplace`` / twin is not a like-for-like ratio."""
    rows = []
    for r in res.get("rows", []):
        if r["variant"] == "fit-laplace":
            continue
        what = f"layer-wise `{r['model']}`, α {r['alpha']}, B {r['batch']}, MAP"
        ours = f"`{r['variant']}` (compile `{r.get('compile', 'default')}`)"
        for twin, key in (("torch twin", "paired_ratio_to_twin"), ("plain strided CNN (another model)", "strided")):
            if r.get(key) is not None:
                rows.append([what, ours, f"{twin}: {r.get('twin_compile', 'eager')}", f"{r[key]:.2f}× (paired)"])
    return rows


def hnn_speed_rows(part: str, res: dict[str, Any], reference: dict[str, Any]) -> list[list[str]]:
    h, rows = res["settings"], []
    what = f"symmetrised HNN, {part.split('-')[1]} (S {h['num_transforms']}, E {h['euler_steps']}, {h['batch']} pairs)"
    for key, system in hnn_reference_pairs(part, res):
        entry, ref = res["particles"][key], reference_step(reference, system)
        ratio = f"{entry['stats']['fit']['median'] / ref:.2f}× (medians)" if ref else "not run"
        plain = "plain HNN, " if system.endswith("-plain") else ""
        ours = f"`fit`, {plain}{key.split()[0]} weight samples (compile {variant_compile(entry, 'fit')})"
        rows.append([what, ours, f"JAX reference, jitted step + update (`{system}`)", ratio + _fell_back(entry)])
    return rows


def render_speed(args: argparse.Namespace) -> Path:
    """The speed table (:data:`SPEED_HEADER`) from ``gpu`` result JSON files, written to ``<out-dir>/speed_table.md``
    and printed, with a note per part on the machine's load and its overlap with the JAX reference's run; the
    reference's timings are taken from whichever file holds them."""
    files = speed_files(args.render_speed)
    payloads = {f: json.loads(f.read_text()) for f in files}
    reference, ref_file = {}, None
    for f, pl in payloads.items():
        if isinstance(pl["results"].get("reference"), dict) and "skipped" not in pl["results"]["reference"]:
            reference, ref_file = pl["results"]["reference"], f
    metas = [pl["results"].get("meta", {}).get("reference") for pl in payloads.values()]
    ref_meta = next((m for m in metas if m), None)  # the reference's interval, even where it was skipped
    rows, notes = [], []
    for f, pl in payloads.items():
        res, where = pl["results"], [pl["machine"]["device"], pl["machine"]["date"][:10], f"`{_shown(f)}`"]
        found = [r for part in ("mlp-overhead", "mlp-paper") if part in res for r in mlp_speed_rows(part, res[part])]
        found += layerwise_speed_rows(res["layerwise"]) if "layerwise" in res else []
        for part in AFTER_REFERENCE:
            if part in res:
                found += hnn_speed_rows(part, res[part], res.get("reference") or reference)
        extra = f" + `{_shown(ref_file)}`" if ref_file and ref_file != f else ""
        rows += [[*r, *where[:2], where[2] + (extra if "JAX" in r[2] else "")] for r in found]
        meta = res.get("meta", {})
        notes += [f"- `{_shown(f)}`, {p}: {part_note(m, ref_meta)}" for p, m in meta.items()]
    names = ", ".join(f"`{_shown(f)}`" for f in files)
    text = f"# Speed table\n\nRendered by `benchmarks/timing.py --section gpu --render-speed` from {names}.\n\n"
    text += common.md_table(SPEED_HEADER, rows) + "\n\nWhat else ran, per part:\n\n" + "\n".join(notes) + "\n"
    out = Path(args.out_dir) / "speed_table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    common.log(f"wrote {out}")
    return out


# ------------------------------------------------------------------------------------------------
# Layer-wise networks (paper 004) vs a plain torch twin (sections layerwise, gpu), and the cost per layer type
# ------------------------------------------------------------------------------------------------
LAYERWISE_MODELS = ("layerwise-conv", "layerwise-f-fc+conv")
LAPLACE_EVERY = 10  # steps between two Laplace updates (fit_laplace's curvature on minibatches of 32)


def polyphase_select_plain(y: Tensor) -> Tensor:
    """Per-example adaptive polyphase selection of ``(B, C, H, W)``: the 2×2 phase of largest norm, in plain torch."""
    b, c, h, w = y.shape
    y6 = y.reshape(b, c, h // 2, 2, w // 2, 2)
    with torch.no_grad():
        index = y6.permute(0, 3, 5, 1, 2, 4).reshape(b, 4, -1).square().sum(-1).argmax(1)
    return y6[torch.arange(b, device=y.device), :, :, index // 2, :, index % 2]


class TwinBlock(nn.Module):
    """``ReLU((Σ pathways)/√K + b)`` with CONV (circular padding, stride 1 + polyphase selection; ``strided``: a
    stride-2 convolution instead, as a plain CNN), F-FC and FC."""

    def __init__(self, spec: Any, kinds: Sequence[str], strided: bool = False) -> None:
        super().__init__()
        if spec.g_in != 1 or spec.g_out != 1 or not set(kinds) <= {"conv", "ffc", "fc"}:
            raise ValueError(f"the twin has CONV, F-FC and FC pathways on plain maps only, got {kinds}")
        self.spec, self.kinds, self.coef = spec, tuple(kinds), {"bias": 1.0}  # parameter -> prior precision (δ = 1)
        if "conv" in kinds:
            stride = spec.stride if strided else 1
            self.conv = nn.Conv2d(spec.c_in, spec.c_out, 3, stride, padding=1, padding_mode="circular", bias=False)
            self.coef["conv.weight"] = spec.c_in * 9 / 2.0  # w = θ·√(2/fan_in)
        if "ffc" in kinds:
            k, c, p, q = spec.c_out, spec.c_in, spec.h_in * spec.w_in, spec.h_out * spec.w_out
            self.ffc_out = nn.Parameter(torch.randn(k, c, q) * math.sqrt(2.0 / c))
            self.ffc_in = nn.Parameter(torch.randn(k, c, p) / math.sqrt(p))
            self.coef["ffc_out"], self.coef["ffc_in"] = c / 2.0, float(p)
        if "fc" in kinds:
            self.fc = nn.Linear(spec.in_size, spec.out_size)
            self.coef["fc.weight"], self.coef["fc.bias"] = spec.in_size / 2.0, 1.0
        self.bias = nn.Parameter(torch.zeros(spec.c_out))

    def forward(self, x: Tensor) -> Tensor:
        s, parts = self.spec, []
        if "conv" in self.kinds:
            polyphase = s.stride == 2 and self.conv.stride == (1, 1)
            parts.append(polyphase_select_plain(self.conv(x)) if polyphase else self.conv(x))
        if "ffc" in self.kinds:
            z = torch.einsum("bcp,kcp->bkc", x.flatten(2), self.ffc_in)
            parts.append(torch.einsum("bkc,kcq->bkq", z, self.ffc_out).reshape(x.shape[0], s.c_out, s.h_out, s.w_out))
        if "fc" in self.kinds:
            parts.append(self.fc(x.flatten(1)).reshape(x.shape[0], s.c_out, s.h_out, s.w_out))
        total = sum(parts[1:], parts[0])
        return F.relu((total / math.sqrt(len(parts)) if len(parts) > 1 else total) + self.bias[:, None, None])


class TwinNet(nn.Module):
    """A plain torch twin of a layer-wise network with CONV / F-FC / FC pathways: the same blocks, strides,
    polyphase selection and head, raw (He-scaled) weights; :meth:`loss` = (N/B)·cross-entropy + ½ Σ δ‖θ‖²
    (δ = 1, θ = w/gain)."""

    def __init__(self, arch: Any, strided: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TwinBlock(spec, arch.kinds, strided) for spec in arch.blocks])
        self.head0 = nn.Linear(arch.head_in, arch.head_hidden)
        self.head1 = nn.Linear(arch.head_hidden, arch.num_classes)
        self.coef = {f"blocks.{i}.{k}": v for i, b in enumerate(self.blocks) for k, v in b.coef.items()}
        head = {"head0.weight": arch.head_in / 2.0, "head0.bias": 1.0, "head1.weight": arch.head_hidden / 1.0}
        self.coef.update({**head, "head1.bias": 1.0})

    def loss(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        h = x
        for block in self.blocks:
            h = block(h)
        logits = self.head1(F.relu(self.head0(h.flatten(1))))
        nll = F.cross_entropy(logits, y, reduction="sum") * (num_data / x.shape[0])
        return nll + sum(0.5 * self.coef[n] * p.square().sum() for n, p in self.named_parameters())

    def gains(self) -> dict[str, float]:
        """``raw parameter = θ·gain`` for every parameter (θ the Pyro site's value)."""
        weights = ("weight", "ffc_out", "ffc_in")
        return {n: 1.0 / math.sqrt(c) if n.endswith(weights) else 1.0 for n, c in self.coef.items()}

    @staticmethod
    def pyro_site(name: str) -> str:
        for ours, pyros in (("ffc_out", "ffc.weight_out"), ("ffc_in", "ffc.weight_in"), ("head0", "head.0")):
            name = name.replace(ours, pyros)
        return name.replace("head1", "head.1")

    @torch.no_grad()
    def load_sites(self, values: dict[str, Tensor]) -> TwinNet:
        gains = self.gains()
        for n, p in self.named_parameters():
            p.copy_(values[self.pyro_site(n)].reshape(p.shape) * gains[n])
        return self


def check_twin(case: dict[str, Any], twin: TwinNet) -> dict[str, Any]:
    """Pyro's MAP loss and site gradients vs the twin's at the same point: Pyro's loss carries the prior's
    normalisers Σ ½ log(2π/δ), added to the twin's; gradients compared per site as ∂/∂θ = gain·∂/∂w."""
    model, guide, n, b = case["model"], case["guide"], case["x"].shape[0], case["batch"]
    values = {k: v.detach() for k, v in guide.median().items()}
    with pyro.validation_enabled(True):
        loss_p = TraceMeanField_ELBO().differentiable_loss(model, guide, case["x"][:b], case["y"][:b], num_data=n)
    loss_p.backward()
    loss_t = twin.loss(case["x"][:b], case["y"][:b], n)
    loss_t.backward()
    grads = {k.removesuffix("_unconstrained"): p.grad for k, p in guide.named_parameters()}
    gains, worst = twin.gains(), (0.0, "")
    for k, p in twin.named_parameters():
        gp = grads[twin.pyro_site(k)].reshape(p.shape)
        worst = max(worst, (float((gp - p.grad * gains[k]).norm() / gp.norm().clamp_min(1e-30)), twin.pyro_site(k)))
    lp = float(loss_p.detach())
    lt = float(loss_t.detach()) + sum(v.numel() for v in values.values()) * 0.5 * math.log(2 * math.pi)
    guide.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    return {
        "loss_pyro": lp,
        "loss_twin_plus_const": lt,
        "loss_rel_diff": abs(lp - lt) / abs(lp),
        "max_grad_rel_diff": worst[0],
        "max_grad_rel_diff_site": worst[1],
    }


def layerwise_size(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "full": {"alpha": args.alpha, "batch": 128, "image": (3, 32, 32)},
        "quick": {"alpha": 2, "batch": 32, "image": (3, 32, 32)},
        "smoke": {"alpha": 1, "batch": 8, "image": (3, 8, 8)},
    }[args.mode]


def measure_layerwise(args: argparse.Namespace, full: tuple[int, int] = (10, 20)) -> list[dict[str, Any]]:
    """Per model and variant (``fit``: the ``map`` guide with ``prior="fixed"``; ``fit-laplace``: ``fit_laplace``
    with diagonal-GGN MacKay updates every 10 steps; ``fit-<mode>``: ``fit(compile=<mode>)``), one run with two
    twins interleaved in its callbacks (:func:`layerwise_row`). The training set is 2·batch random images."""
    size, seed = layerwise_size(args), args.seed
    warmup, steps = steps_of(args, full)
    gen = torch.Generator().manual_seed(seed)
    n = 2 * size["batch"]
    x, y = torch.randn(n, *size["image"], generator=gen), torch.randint(0, 10, (n,), generator=gen)
    return [
        layerwise_row(args, name, variant, size, (x, y), warmup, steps)
        for name in args.models
        for variant in args.layerwise_variants
    ]


def layerwise_row(
    args: argparse.Namespace,
    name: str,
    variant: str,
    size: dict[str, Any],
    data: tuple[Tensor, Tensor],
    warmup: int,
    steps: int,
) -> dict[str, Any]:
    """One ``fit`` of ``name`` with the twin (polyphase selection, as the model) and the plain strided CNN (stride-2
    convolutions: another model, what a plain CNN of this size computes), both loaded with the MAP point and given
    the twin-side treatment of the variant's compile mode (:func:`twin_for`): fused Adam, no per-step host read."""
    device, seed, total = torch.device(args.device), args.seed, warmup + steps + 3
    pyro.set_rng_seed(seed)
    model = pi.MODELS.get(name, image_shape=size["image"], num_classes=10, alpha=size["alpha"], prior="fixed")
    case = make_case(model, "map", *data, size["batch"])
    values = {k: v.detach() for k, v in case["guide"].median().items()}
    twin = TwinNet(model.arch).load_sites(values)
    check = check_twin(case, twin)
    mode = variant.removeprefix("fit-") if variant not in ("fit", "fit-laplace") else "default"
    others, infos = {}, {}
    for label, net in (("twin", twin), ("twin-strided", TwinNet(model.arch, strided=True).load_sites(values))):
        groups = [{"params": list(net.to(device).parameters()), "lr": 1e-2}]
        step, infos[label] = twin_for(mode, net.loss, groups, case, total, seed, device)
        others.update({label: step} if step else {})
    laplace = dict(every=LAPLACE_EVERY, warmup=0, curvature="diagonal", delta_update="mackay")
    fit_fn = functools.partial(pi.fit_laplace, **laplace) if variant == "fit-laplace" else pi.fit
    e = time_fit(case, others, warmup, steps, seed, device, fit_fn=fit_fn, **_compile(mode))
    fit, tw, ts = e["stats"]["fit"], e["stats"].get("twin"), e["stats"].get("twin-strided")
    row = dict(model=name, variant=variant, device=str(device), alpha=size["alpha"], batch=size["batch"])
    row.update(train_size=data[0].shape[0], params=model.num_parameters(), ms_per_step=fit["mean"] * 1e3)
    row.update(step_ms_median=fit["median"] * 1e3, ms_q1=fit["q1"] * 1e3, ms_q3=fit["q3"] * 1e3)
    row.update(twin_ms=tw["median"] * 1e3 if tw else None, strided_ms=ts["median"] * 1e3 if ts else None)
    row.update(ratio_to_twin=fit["median"] / tw["median"] if tw else None, peak_mem_mib=e["peak_mib"].get("fit"))
    row.update(paired_ratio_to_twin=e["paired_to_twin"].get("fit", {}).get("median"))
    paired = [a / b for a, b in zip(e["times"]["fit"], e["times"].get("twin-strided", []))]
    row.update(strided=statistics.median(paired) if paired else None, compile=mode, twins=infos)
    row.update(twin_compile=variant_compile({"variants": infos}, "twin"), warmup=warmup)
    common.log(f"[layerwise {name} {variant}] {_brief(e)}")
    return {**row, "steps": fit["n"], "check": check, "step_stats": e["step_stats"]}


CHECK_ROW = (
    "`{model}` | {loss_pyro:.6g} | {loss_twin_plus_const:.6g} | {loss_rel_diff:.1e} "
    "| {max_grad_rel_diff:.1e} ({max_grad_rel_diff_site})"
)


def _x(v: float | None, unit: str = "×") -> str:
    return "–" if v is None else f"{v:.2f}{unit}" if unit else f"{v:.1f}"


def render_layerwise(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No layer-wise rows."
    table = []
    for r in rows:
        ran = r.get("step_stats", {}).get("compile")
        ours = f"`{r['variant']}`" + (f" (ran `{ran}`)" if ran and ran != r.get("compile", "default") else "")
        cells = [f"α={r['alpha']}, B={r['batch']}", f"`{r['model']}`", ours, f"{r['params']:,}"]
        cells += [f"{r['ms_per_step']:.1f}", f"{r['step_ms_median']:.1f}", r.get("twin_compile", "eager")]
        cells += [
            _x(r["twin_ms"], ""),
            _x(r["paired_ratio_to_twin"]),
            _x(r.get("strided_ms"), ""),
            _x(r.get("strided")),
        ]
        table.append([*cells, f"{r['steps']} / {r.get('warmup', '–')}", _mib(r.get("peak_mem_mib"))])
    first = rows[0]["variant"]
    checks = [
        CHECK_ROW.format(model=r["model"], **c).split(" | ")
        for r in rows
        if (c := r.get("check")) and r["variant"] == first
    ]
    head = "size | model | variant | params | ms/step (mean: amortised) | median ms | twins' compile | twin ms "
    head += "| fit / twin (paired) | strided CNN ms | fit / strided CNN (paired) | timed / warm-up | peak MiB"
    check_head = "model | Pyro loss | twin loss + normaliser | rel. diff | max rel. grad diff (site)"
    note = (
        "`fit-laplace` includes a diagonal-GGN Laplace update every 10 steps, which the twins do not have: its "
        "ratios are not like for like. Twin check (the twin loaded with the MAP point, one minibatch, before timing):"
    )
    title = f"## Layer-wise networks, α = {rows[0]['alpha']}"
    return "\n".join([title, "", common.md_table(head, table), "", note, "", common.md_table(check_head, checks), ""])


@section("layerwise_step_time", "Layer-wise networks: time per training step vs a plain torch twin")
def section_layerwise(args: argparse.Namespace) -> Published:
    """`fit` (the `map` guide, `prior="fixed"`: δ = 1) or `fit_laplace` (diagonal GGN, MacKay's update every 10
    steps) timed between its callbacks; a plain torch twin (`nn.Conv2d` with circular padding at stride 1 + the same
    polyphase selection, the same F-FC einsums and head; loss (N/B)·CE + ½ Σ δ‖θ‖²) steps inside them. The mean over
    the timed steps is the amortised time (Laplace updates included)."""
    rows = measure_layerwise(args)
    lines = [
        f"- α = {r['alpha']}, `{r['model']}`, `{r['variant']}`: fit / twin = {_x(r['paired_ratio_to_twin'])} "
        f"(paired), {_x(r['ratio_to_twin'])} (ratio of medians); fit / the plain strided CNN = {_x(r['strided'])}."
        for r in rows
    ]
    size = layerwise_size(args)
    settings = {
        "size": size,
        "models": args.models,
        "variants": args.layerwise_variants,
        "warm-up / timed steps": "{} / {}".format(*steps_of(args, (10, 20))),
        "train_size N": "2·batch",
        "twins": "one Adam group (lr 0.01, fused), cosine, no per-step host reads; the compile mode's treatment",
    }
    return settings, render_layerwise(rows), {"rows": rows}, lines


def in_child(args: argparse.Namespace, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``CHILDREN[kind](spec)`` in a fresh process (its own peak memory); in-process with ``--smoke``."""
    if args.mode == "smoke":
        return CHILDREN[kind](spec)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(spec), "--threads", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# Smaller sections
# ------------------------------------------------------------------------------------------------
@section(
    "noether_flow_step_time",
    "Symmetrised HNN: ODE-flow vs matrix-exponential symmetry samples, time per step",
)
def section_noether_flow(args: argparse.Namespace) -> Published:
    """The symmetrised HNN on Kepler-sized states (M = 4, batch 100, K = 3, ball sampling, matrix-normal guide) at
    S symmetry samples: the quadratic symmetry (matrix exponentials) vs the learned non-quadratic C (32 hidden units
    + a quadratic form; RK4 flows of n steps), and the plain HNN."""
    smoke = args.mode == "smoke"
    base = {"hidden": (8, 8) if smoke else (64, 64), "euler_steps": 2 if smoke else 5}
    base.update(num_generators=3, sampling="ball")
    warmup, steps = steps_of(args, (2, 10))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100, 4, generator=gen)
    y = x + 0.05 * torch.randn(100, 4, generator=gen)
    variants = [("HNN", 8, {"symmetry": "none"})]
    for s in (2,) if smoke else (8, 32):
        variants.append((f"quadratic (expm), S = {s}", s, {"symmetry": "quadratic"}))
        for k in (2,) if smoke else (4, 8):
            variants.append(
                (
                    f"non-quadratic (RK4 × {k}), S = {s}",
                    s,
                    {"symmetry": "neural", "flow_steps": k, "conserved_hidden": (32,)},
                )
            )
    rows = []
    for label, s, extra in variants:
        pyro.set_rng_seed(0)
        kw = {**base, **extra}
        if kw["symmetry"] == "none":
            kw.pop("num_generators"), kw.pop("sampling")
        model = SymmetrisedHNN(4, num_transforms=s, dt=0.5, **kw)
        guide = guides.get("matrix-normal", model, init_scale=0.01)
        case = {"model": model, "guide": guide, "x": x, "y": y, "fit": {"batch_size": None}}
        e = time_fit(case, {}, warmup, steps, 0, torch.device(args.device))
        st = e["stats"]["fit"]
        rows.append({"variant": label, "S": s, "s_per_step": st["mean"], "median_s": st["median"]})
        common.log(f"{label}: {rows[-1]['s_per_step'] * 1e3:.0f} ms/step")
    quad = {r["S"]: r["s_per_step"] for r in rows if r["variant"].startswith("quadratic")}
    table = [
        [
            r["variant"],
            f"{r['s_per_step'] * 1e3:.0f}",
            f"{r['s_per_step'] / quad[r['S']]:.1f}×" if r["S"] in quad and r["variant"] != "HNN" else "–",
        ]
        for r in rows
    ]
    settings = {**base, "state_dim": 4, "batch": 100, "timed_steps": steps, "warmup": warmup}
    return (
        settings,
        common.md_table("variant | ms/step (mean) | vs quadratic at the same S", table) + "\n",
        {"rows": rows},
    )


TRANSFORM_SIZES = {
    "paper": {"batch": 128, "samples": 32, "hidden": 1024, "side": 28},
    "small": {"batch": 32, "samples": 4, "hidden": 64, "side": 28},
    "smoke": {"batch": 8, "samples": 2, "hidden": 16, "side": 8},
}


def _features_steps(cfg: dict[str, int], activation: str, seed: int) -> dict[str, Callable[[], Any]]:
    """Per path: ``features(x)`` forward + ``autograd.grad`` of ⟨features(x), g⟩ (train) and the forward under
    ``no_grad`` (eval), for a model with rotation learned at η = 0.5."""
    model = InvariantMLP(
        image_shape=(1, cfg["side"], cfg["side"]),
        hidden=cfg["hidden"],
        activation=activation,
        symmetry="rotation",
        eta_init=0.5,
        num_transforms=cfg["samples"],
        init_seed=seed,
    )
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(cfg["batch"], cfg["side"] ** 2, generator=gen)
    g = torch.randn(cfg["batch"], cfg["hidden"], generator=gen)
    params = [p for p in model.parameters() if p.requires_grad]

    def features(path: str) -> Tensor:
        model.transform_on = path
        return model.features(x)

    def train(path: str) -> Callable[[], Any]:
        return lambda: torch.autograd.grad((features(path) * g).sum(), params)

    def evaluate(path: str) -> Callable[[], Any]:
        return lambda: torch.no_grad()(features)(path)

    paths = ("weights", "inputs")
    return {**{f"train {p}": train(p) for p in paths}, **{f"eval {p}": evaluate(p) for p in paths}}


@section("transform_path", "Transform path of InvariantMLP: warp weights or inputs")
def section_transform_path(args: argparse.Namespace) -> Published:
    """``InvariantMLP.features`` warps the S·H rows of W1 by T_s (``transform_on="weights"``, ~S·H·D
    interpolations) or the S·B inputs by T_s⁻¹ (``"inputs"``, ~S·B·D, with |det T_s|⁻¹); the matmul FLOPs
    2·S·B·H·D are the same.
    ``"auto"`` takes ``"inputs"`` when B < H. Timed: both paths interleaved (median and IQR), and a sweep over B at
    S = 8 locating the crossover (train: forward + backward, η learned; eval: forward under ``no_grad``)."""
    smoke, results, sweep = args.mode == "smoke", {}, []
    reps = {"paper": 15, "small": 200, "smoke": 2}
    for size in ("smoke",) if smoke else ("paper", "small"):
        for act in args.activations:
            times = interleaved(
                _features_steps(TRANSFORM_SIZES[size], act, args.seed), 1 if smoke else 2, args.steps or reps[size]
            )
            results[f"{size}/{act}"] = {"stats": {k: summary(v) for k, v in times.items()}}
    grid = {16: [4, 32]} if smoke else {256: [32, 64, 128, 256, 512, 1024], 1024: [256, 512, 1024, 2048]}
    for act in args.activations:
        for hidden, batches in grid.items():
            for b in batches:
                cfg = {"batch": b, "samples": 2 if smoke else 8, "hidden": hidden, "side": 8 if smoke else 28}
                times = interleaved(_features_steps(cfg, act, args.seed), 1, 1 if smoke else 7)
                sweep.append(
                    {
                        "batch": b,
                        "hidden": hidden,
                        "activation": act,
                        "median_s": {k: statistics.median(v) for k, v in times.items()},
                    }
                )
    parts = ["## features: median ms (IQR)", ""]
    rows = [
        [
            key,
            *(f"{v['median'] * 1e3:.2f} ({v['q1'] * 1e3:.2f}–{v['q3'] * 1e3:.2f})" for v in e["stats"].values()),
            f"{e['stats']['train weights']['median'] / e['stats']['train inputs']['median']:.2f}",
        ]
        for key, e in results.items()
    ]
    head = "size/activation | train weights | train inputs | eval weights | eval inputs | train w/i"
    parts += [common.md_table(head, rows), "", "## Crossover over B (median ms; w/i > 1: inputs faster)", ""]
    rows = []
    for r in sweep:
        ms = {k: f"{v * 1e3:.2f}" for k, v in r["median_s"].items()}
        ratios = [f"{r['median_s'][f'{m} weights'] / r['median_s'][f'{m} inputs']:.2f}" for m in ("train", "eval")]
        cells = [ms[f"{m} {p}"] for m in ("train", "eval") for p in ("weights", "inputs")]
        rows.append([r["activation"], r["hidden"], r["batch"], f"{r['batch'] / r['hidden']:.3g}", *cells, *ratios])
    head = "activation | H | B | B/H | train weights | train inputs | eval weights | eval inputs | train w/i | eval w/i"
    parts += [common.md_table(head, rows), ""]
    settings = {
        "sizes": TRANSFORM_SIZES,
        "repetitions": args.steps or reps,
        "sweep": f"S = 8, B per H: {grid}",
        "symmetry": "rotation, η learned (init 0.5)",
    }
    return settings, "\n".join(parts), {"results": {"features": results, "sweep": sweep}}


KFAC_VARIANTS = ("fc", "conv", "fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv")
KFAC_METHODS = ("diagonal", "kfac-sampled", "kfac-exact")


def child_kfac(spec: dict[str, Any]) -> dict[str, Any]:
    """One curvature pass over the data + δ update, ``repeats`` times (median seconds), and the peak RSS."""
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pyro.set_rng_seed(0)
    size, n = spec["size"], spec["num_data"]
    model = LayerwiseNet(spec["variant"], (1, size, size), 10, alpha=spec["alpha"], prior="fixed")
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, 1, size, size, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    guide = guides.get("map", model, init_loc_fn=make_init_loc_fn(model.arch, "prior"))
    with poutine.block():
        guide(x[:2], y[:2])
    values = {k: v.detach() for k, v in guide.median().items()}
    sites = [s for g in model.precision_groups() for s in g.sites]
    loaded, times = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, []
    for r in range(spec["repeats"]):
        t0, rng = time.perf_counter(), torch.Generator().manual_seed(r)
        if spec["method"] == "diagonal":
            mackay_update(model, values, diagonal_ggn(model, values, x, sites, batch_size=32, generator=rng))
        else:
            curv = kfac_curvature(model, values, x, batch_size=32, labels=spec["method"].split("-")[1], generator=rng)
            gradient_update(model, values, curv, steps=100, lr=0.1)
        times.append(time.perf_counter() - t0)
    return {
        "variant": spec["variant"],
        "method": spec["method"],
        "params": model.num_parameters(),
        "seconds": sorted(times)[len(times) // 2],
        "model_loaded_rss_mb": loaded / 1024,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "baseline_rss_mb": baseline / 1024,
    }


@section("kfac_update_cost", "Layer-wise Laplace: cost of one curvature + δ update, KFAC vs diagonal")
def section_kfac(args: argparse.Namespace) -> Published:
    """For every layer-wise variant at α = 2 on 16-px inputs: seconds for one curvature pass over the data
    (``kfac_curvature`` with exact labels, C backward passes per minibatch of 32; sampled labels, one; the diagonal
    GGN with one label draw) plus the δ update that follows (KFAC: 100 Adam steps on log δ; diagonal: MacKay's
    update), and the peak resident memory of a fresh process doing it."""
    sizes = {"full": (512, 3, 2, 16), "quick": (128, 1, 2, 16), "smoke": (16, 1, 1, 8)}
    num_data, repeats, alpha, size = sizes[args.mode]
    variants = ("fc", "conv") if args.mode == "smoke" else KFAC_VARIANTS
    spec = {"num_data": num_data, "repeats": repeats, "alpha": alpha, "size": size}
    rows = [in_child(args, "kfac", {"variant": v, "method": m, **spec}) for v in variants for m in KFAC_METHODS]
    body = []
    for r in rows:
        diag = next(d for d in rows if d["variant"] == r["variant"] and d["method"] == "diagonal")
        cost = [f"{r['seconds']:.2f}", f"{r['seconds'] / diag['seconds']:.1f}×", f"{r['peak_rss_mb']:.0f}"]
        rss = f"{r['peak_rss_mb'] - r['model_loaded_rss_mb']:+.0f}"
        body.append([r["variant"], f"{r['params']:,}", r["method"], *cost, rss])
    settings = {
        "alpha": alpha,
        "input": f"1×{size}×{size}",
        "classes": 10,
        "num_data": num_data,
        "minibatch": 32,
        "repeats (median)": repeats,
        "delta update": "KFAC: 100 Adam steps on log δ; diagonal: MacKay",
    }
    table = common.md_table(
        "variant | params | curvature | seconds / update | vs diagonal | peak RSS (MB) "
        "| peak above the loaded model (MB)",
        body,
    )
    return settings, table + "\n", {"rows": rows}


GUIDE_NAMES = ("map", "mean-field", "matrix-normal", "block-cholesky", "full-rank")


@section("guide_cost", "Guide cost per SVI step as the model grows (InvariantMLP, rotated digits)")
def section_guides(args: argparse.Namespace) -> Published:
    """For every hidden width H (latents: W2 (10 × H), b2 and σ_p), the invariant MLP (RFF, learned rotation, S = 16,
    8×8 rotated digits) from the same seed with each guide: ``fit``'s step (batch 128), several short fits per guide
    in rotated order. ``map`` (no sampling, no log q) gives the model's own cost: t(guide) − t(map) is the guide's."""
    widths = {"full": (32, 64, 128, 256, 512), "quick": (32, 64), "smoke": (8,)}[args.mode]
    rounds, (warmup, steps) = (1 if args.mode == "smoke" else 3), steps_of(args, (1, 5), (1, 2))
    x, y = digits(args.mode, 128 if args.mode == "smoke" else None)
    samples = 2 if args.mode == "smoke" else 16
    rows = []
    for h in widths:
        cases = {}
        for g in GUIDE_NAMES:
            pyro.set_rng_seed(args.seed)
            model = InvariantMLP(
                image_shape=(1, 8, 8), num_classes=10, hidden=h, num_transforms=samples, symmetry="rotation"
            )
            cases[g] = {"model": model, "guide": guides.get(g, model), "x": x, "y": y, "fit": {"batch_size": 128}}
        times: dict[str, list[float]] = {g: [] for g in GUIDE_NAMES}
        for r in range(rounds):
            for g in rotated(GUIDE_NAMES, r):
                times[g] += time_fit(cases[g], {}, warmup, steps, args.seed, torch.device(args.device))["times"]["fit"]
        base = statistics.median(times["map"])
        for g in GUIDE_NAMES:
            st = summary(times[g])
            rows.append(
                {
                    "hidden": h,
                    "latents": 10 * h + 11,
                    "guide": g,
                    "median_s": st["median"],
                    "params": guides.num_guide_parameters(cases[g]["guide"]),
                    "iqr_s": st["q3"] - st["q1"],
                    "overhead_s": st["median"] - base,
                }
            )
            common.log(f"H={h} {g}: {st['median'] * 1e3:.1f} ms/step")
    by = {(r["hidden"], r["guide"]): r for r in rows}
    parts = [
        "## Median time per step (ms)",
        "",
        common.md_table(
            ["H", "latents D", *GUIDE_NAMES],
            [[h, 10 * h + 11, *(f"{by[h, g]['median_s'] * 1e3:.1f}" for g in GUIDE_NAMES)] for h in widths],
        ),
        "",
        "## Guide overhead per step, t(guide) − t(map) (ms)",
        "",
        common.md_table(
            ["H", *GUIDE_NAMES[1:]],
            [[h, *(f"{by[h, g]['overhead_s'] * 1e3:.1f}" for g in GUIDE_NAMES[1:])] for h in widths],
        ),
        "",
        "## Guide parameters (effective free coordinates)",
        "",
        common.md_table(["H", *GUIDE_NAMES], [[h, *(f"{by[h, g]['params']:,}" for g in GUIDE_NAMES)] for h in widths]),
        "",
    ]
    settings = {
        "model": "invariant-mlp (RFF, rotation learned, hierarchical prior)",
        "data": "rotated-digits",
        "widths H": widths,
        "batch B": 128,
        "transform samples S": samples,
        "rounds × (warm-up / timed steps)": f"{rounds} × ({warmup} / {steps})",
    }
    return settings, "\n".join(parts), {"rows": rows}


def digits(mode: str, n: int | None = None) -> tuple[Tensor, Tensor]:
    """The 8×8 rotated digits (``n`` training images; all with ``None``), or random images of that shape in a smoke
    run (the data set's first load imports scikit-learn)."""
    if mode == "smoke":
        gen = torch.Generator().manual_seed(0)
        return torch.rand(n or 128, 1, 8, 8, generator=gen), torch.randint(0, 10, (n or 128,), generator=gen)
    data = pi.load_dataset("rotated-digits", **({"train_size": n, "test_size": 16} if n else {}))
    return data.x_train, data.y_train


def ddp_fit(spec: dict[str, Any], **kw: Any) -> tuple[list[float], list[float]]:
    """A fit of the invariant MLP (block-Cholesky): its per-step ELBO history and the step intervals after warm-up."""
    data = digits(spec["mode"], spec["train_size"])
    model = pi.MODELS.get(
        "invariant-mlp", image_shape=(1, 8, 8), hidden=spec["hidden"], num_transforms=spec["transforms"]
    )
    stamps: list[float] = []
    sync = sync_of(torch.device(spec["device"]))

    def clock(step: int, model: Any, guide: Any) -> None:
        sync()
        stamps.append(time.perf_counter())

    res = pi.fit(
        model,
        "block-cholesky",
        data,
        steps=spec["steps"],
        batch_size=spec["batch"],
        seed=0,
        progress=False,
        device=spec["device"],
        log_every=spec["steps"],
        callbacks=[clock],
        **kw,
    )
    w = spec["warmup"]
    return res.history["elbo"], [b - a for a, b in zip(stamps[w:], stamps[w + 1 :])]


def ddp_rank(rank: int, world: int, spec: dict[str, Any], rendezvous: str, out: str) -> None:
    torch.set_num_threads(1)
    init = f"file://{rendezvous}"
    torch.distributed.init_process_group(spec["backend"], init_method=init, rank=rank, world_size=world)
    try:
        elbo, gaps = ddp_fit(spec, strategy="ddp", shards=2)
        if rank == 0:
            torch.save({"elbo": elbo, "gaps": gaps}, out)
    finally:
        torch.distributed.destroy_process_group()


@section("ddp_throughput", "Data-parallel SVI: time per step, 1 process vs 2 ranks")
def section_ddp(args: argparse.Namespace) -> Published:
    """Three runs of ``fit`` with the same global minibatch, interleaved: 1 process on the whole minibatch; 1 process,
    2 shards one after another; ``strategy="ddp"`` on 2 ranks (``torch.multiprocessing.spawn``, ``gloo`` or ``nccl``),
    one shard each. A step is the median interval between callbacks after the warm-up. On one GPU both ranks share the
    card: a simulated 2-rank run (its overhead, not a speed-up)."""
    smoke = args.mode == "smoke"
    spec = {
        "train_size": 64 if smoke else 1024,
        "hidden": 8 if smoke else 256,
        "transforms": 2 if smoke else 8,
        "batch": 16 if smoke else 256,
        "steps": 4 if smoke else 40,
        "warmup": 1 if smoke else 5,
        "device": args.device,
        "backend": args.backend,
        "mode": args.mode,
    }
    runs: dict[str, list[float]] = {"1 process, 1 shard": [], "1 process, 2 shards": [], "2 ranks, 2 shards": []}
    max_diff = 0.0
    for rep in range(3 if args.mode == "full" else 1):
        histories = {}
        for name in rotated(list(runs), rep):
            if name.startswith("2 ranks"):
                with tempfile.TemporaryDirectory() as tmp:
                    mp.spawn(ddp_rank, args=(2, spec, os.path.join(tmp, "rdv"), os.path.join(tmp, "r0.pt")), nprocs=2)
                    record = torch.load(os.path.join(tmp, "r0.pt"), weights_only=True)
                histories[name], gaps = record["elbo"], record["gaps"]
            else:
                histories[name], gaps = ddp_fit(spec, shards=1 if name.endswith("1 shard") else 2)
            runs[name].append(statistics.median(gaps))
            common.log(f"rep {rep} {name}: {1e3 * runs[name][-1]:.1f} ms/step")
        a, b = histories["1 process, 2 shards"], histories["2 ranks, 2 shards"]
        max_diff = max(max_diff, max(abs(u - v) for u, v in zip(a, b)))
    base = statistics.median(runs["1 process, 1 shard"])
    rows = [
        [
            name,
            f"{1e3 * statistics.median(t):.1f}",
            " / ".join(f"{1e3 * v:.1f}" for v in t),
            f"{statistics.median(t) / base:.2f}×",
        ]
        for name, t in runs.items()
    ]
    body = (
        common.md_table("run | ms/step (median) | per repetition | vs 1 shard", rows) + "\n\nLargest "
        "difference between the per-step ELBO/N of the 1-process 2-shard run and the 2-rank run: "
        f"{max_diff:.2e}.\n"
    )
    return (
        spec,
        body,
        {"ms_per_step": {k: [1e3 * v for v in t] for k, t in runs.items()}, "max_elbo_difference": max_diff},
    )


@section("hnn_particles", "symmetrised-hnn: time per step, sequential vs vectorised particles")
def section_particles(args: argparse.Namespace) -> Published:
    """P ELBO particles of the symmetrised HNN (SHO, full batch, matrix-normal guide): one after another
    (``TraceMeanField_ELBO(num_particles=P)``) or vectorised (``vectorize_particles=True``: one pass, every Euler
    sub-step one ``autograd.grad`` over particles, symmetry samples and rows): the same estimator. The step is the
    plain Pyro step (Pyro's ELBO is what differs here); the two interleaved."""
    smoke = args.mode == "smoke"
    settings = (
        {"SHO (8,8) S=2 E=2": {"hidden": (8, 8), "num_transforms": 2, "euler_steps": 2}}
        if smoke
        else {
            "SHO (32,32) S=8 E=4": {"hidden": (32, 32), "num_transforms": 8, "euler_steps": 4},
            "SHO (64,64) S=16 E=5": {"hidden": (64, 64), "num_transforms": 16, "euler_steps": 5},
        }
    )
    particles = (1, 2) if smoke else (1, 20)
    warmup, reps = steps_of(args, (3, 30))
    x, y = train_arrays(pi.DATASETS.get("sho", cache_dir=False))
    if smoke:
        x, y = x[:6], y[:6]
    rows = []
    for label, setting in settings.items():
        for p in particles:
            steppers = {}
            for v in ("sequential", "vectorised"):
                pyro.set_rng_seed(args.seed)
                model = pi.MODELS.get(
                    "symmetrised-hnn", symmetry="quadratic", num_generators=1, sampling="cube", **setting
                )
                case = make_case(model, "matrix-normal", x, y, None, init_scale=0.01)
                steppers[v] = pyro_step(
                    case, warmup + reps + 3, args.seed, torch.device("cpu"), particles=p, vectorise=v == "vectorised"
                )
            times = interleaved(steppers, warmup, reps)
            row: dict[str, Any] = {"setting": label, "particles": p}
            for v, ts in times.items():
                st = summary(ts)
                row[v] = {"median_s": st["median"], "iqr_s": [st["q1"], st["q3"]], "times_s": ts}
            row["speedup"] = row["sequential"]["median_s"] / row["vectorised"]["median_s"]
            rows.append(row)
    cell = "{:.1f} ({:.1f}–{:.1f})"
    table = [
        [
            r["setting"],
            r["particles"],
            *(
                cell.format(*(1e3 * t for t in (r[v]["median_s"], *r[v]["iqr_s"])))
                for v in ("sequential", "vectorised")
            ),
            f"×{r['speedup']:.2f}",
        ]
        for r in rows
    ]
    header = ["setting", "particles", "sequential ms/step (IQR)", "vectorised ms/step (IQR)", "speed-up"]
    return (
        {"settings": settings, "particles": particles, "warmup": warmup, "reps": reps},
        common.md_table(header, table),
        {"rows": rows, "train_pairs": int(x.shape[0])},
    )


@section("gpu_determinism", "Do layer-wise MAP / Laplace fits repeat and resume bit for bit?")
def section_determinism(args: argparse.Namespace) -> Published:
    """Fits ``layerwise-fc+conv`` (α = 2, 256 quadrant digits, 30 MAP steps with diagonal Laplace-evidence updates
    every 10) twice, and once more split at step 15 and resumed from its checkpoint: do δ, the weights and the log
    evidence agree exactly? With ``--deterministic`` (``make_deterministic()``), also the CLI twice. Measured on an
    NVIDIA H200 (torch 2.11): default kernels differ between two identical runs; deterministic ones repeat and resume
    bit for bit."""
    if args.deterministic:
        make_deterministic()
    smoke = args.mode == "smoke"
    steps, every = (4, 2) if smoke else (30, 10)
    data = build_quadrant_dataset("digits", 10)
    x, y = data.x_train[: 32 if smoke else 256], data.y_train[: 32 if smoke else 256]
    tmp = Path(tempfile.mkdtemp())

    def run(**kw: Any) -> tuple[Any, Any]:
        pyro.set_rng_seed(0)
        model = LayerwiseNet("fc+conv", (1, 16, 16), 10, alpha=1 if smoke else 2, prior="fixed")
        return model, pi.fit_laplace(
            model,
            "map",
            (x, y),
            steps=steps,
            every=every,
            warmup=every,
            progress=False,
            batch_size=16 if smoke else 64,
            lr=1e-2,
            device=args.device,
            curvature="diagonal",
            delta_update="mackay",
            **kw,
        )

    def same(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
        (ma, ra), (mb, rb) = a, b
        ga, gb = ra.guide.median(), rb.guide.median()
        deltas = zip(ma.symmetry_summary().values(), mb.symmetry_summary().values())
        return (
            all(torch.equal(u, v) for u, v in deltas)
            and all(torch.equal(ga[k], gb[k]) for k in ga)
            and (ra.log_evidence == rb.log_evidence)
        )

    first, second = run(), run()
    run(checkpoint_path=tmp / "ck.pt", until_step=steps // 2)
    resumed = run(checkpoint_path=tmp / "ck.pt", resume=True)
    found = {"repeat identical": same(first, second), "resumed identical": same(first, resumed)}
    if args.deterministic and not smoke:
        histories = []
        for name in ("r1", "r2"):
            cli = shlex.split(
                f"fit --model layerwise-fc+conv --objective laplace --data quadrant-digits --device {args.device}"
            )
            cli += shlex.split("--deterministic --steps 30 --laplace-every 10 --laplace-warmup 10 --model-arg alpha=2")
            cli += [*shlex.split("--train-size 300 --no-progress --eval-samples 1 --out"), str(tmp / name)]
            code = f"import sys; from pyro_invariance.cli import main; sys.exit(main({cli!r}))"
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            histories.append(json.loads((tmp / name / "result.json").read_text())["history"])
        found["CLI histories identical"] = histories[0] == histories[1]
    common.log(str(found))
    body = common.md_table("check | result", [[k, str(v)] for k, v in found.items()]) + "\n"
    return {"deterministic kernels": args.deterministic, "steps": steps, "Laplace every": every}, body, {"found": found}


IMPORT_CODE = "import time; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"


@section("import_time", "Import time of the package")
def section_import(args: argparse.Namespace) -> Published:
    """Wall time of ``import pyro_invariance`` in fresh processes (median over repetitions; the import alone, and the
    whole process), beside ``import torch, pyro`` alone, and the slowest top-level packages (first import, with what
    they import) of one ``python -X importtime`` run."""
    reps = 1 if args.mode == "smoke" else max(5, args.steps or 7)
    rows, found = [], {}
    modules = (("torch + pyro", "torch, pyro"), ("pyro_invariance", "pyro_invariance"))
    for label, module in (("json", "json"), ("statistics", "statistics")) if args.mode == "smoke" else modules:
        inner, outer = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", IMPORT_CODE.format(module)], capture_output=True, text=True, check=True
            )
            outer.append(time.perf_counter() - t0)
            inner.append(float(out.stdout.strip().splitlines()[-1]))
        found[label] = {"import_s": inner, "process_s": outer}
        rows.append(
            [
                f"`import {module}`",
                f"{statistics.median(inner):.2f}",
                f"{statistics.median(outer):.2f}",
                " / ".join(f"{v:.2f}" for v in inner),
            ]
        )
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    ).stderr
    top = []
    for line in trace.splitlines():
        cells = line.removeprefix("import time:").split("|")
        if len(cells) == 3 and cells[1].strip().isdigit() and "." not in cells[2].strip():
            top.append((int(cells[1]) / 1e6, cells[2].strip()))
    top = sorted(top, reverse=True)[:12]
    body = "\n".join(
        [
            common.md_table("what | import s (median) | process s (median) | each import s", rows),
            "",
            "Slowest top-level packages in the import (`python -X importtime`, cumulative seconds):",
            "",
            common.md_table("module | s", [[f"`{m}`", f"{s:.2f}"] for s, m in top]),
            "",
        ]
    )
    return {"repetitions": reps}, body, {"found": found, "top_level": top}


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
SECTIONS: dict[str, Callable[[argparse.Namespace], Published]] = {
    "step": section_step,
    "gpu": section_gpu,
    "layerwise": section_layerwise,
    "noether-flow": section_noether_flow,
    "transform-path": section_transform_path,
    "kfac": section_kfac,
    "guides": section_guides,
    "ddp": section_ddp,
    "particles": section_particles,
    "determinism": section_determinism,
    "import": section_import,
}
CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"kfac": child_kfac}


def _list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip() and v.strip() != "none"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--section", default=None, help=f"comma-separated, of {', '.join(SECTIONS)}; or all")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="reduced sizes")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="toy sizes: seconds on CPU")
    p.set_defaults(mode="full")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda where available for gpu, else cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="timed steps (or repetitions) instead of the section's")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps after the first instead of the section's")
    p.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    p.add_argument("--stem", default=None, help="result file stem instead of the section's")
    p.add_argument("--activations", default="rff", help="invariant MLP: comma-separated rff, relu")
    p.add_argument(
        "--compile-modes",
        default="",
        help="step, gpu, layerwise: extra fit runs with compile= capture, inductor, cudagraphs",
    )
    p.add_argument("--tf32", action="store_true", help="CUDA: fit(tf32=True)")
    p.add_argument(
        "--parts",
        default="mlp-overhead,mlp-paper,hnn-sho,hnn-3body,layerwise",
        help=f"gpu: comma-separated, of {', '.join(GPU_PARTS)}",
    )
    p.add_argument("--sho-particles", default="", help="gpu: SHO weight samples (default 20,1)")
    p.add_argument("--repeats", type=int, default=1, help="gpu: fresh fit-vs-twin runs per MLP compile mode (median)")
    p.add_argument("--fit-steps", type=int, default=None, help="gpu, step: default-mode MLP run length (library's)")
    p.add_argument("--skip-default", action="store_true", help="gpu: MLP parts run only the --compile-modes")
    p.add_argument("--alpha", type=int, default=10, help="layerwise: width α")
    p.add_argument("--models", default=",".join(LAYERWISE_MODELS), help="layerwise: catalogue names")
    p.add_argument("--layerwise-variants", default="fit,fit-laplace", help="layerwise: fit, fit-laplace, fit-<mode>")
    p.add_argument("--reference-dir", type=Path, default=None, help="gpu: a checkout of tychovdo/noethers-razor")
    p.add_argument(
        "--reference-go",
        type=Path,
        default=None,
        help="gpu: the reference compiles, then waits until this file exists before its steps (timed alone)",
    )
    p.add_argument("--reference-systems", default="", help="gpu: hnn-sho, hnn-3body (default: the HNN parts)")
    p.add_argument(
        "--render-speed",
        type=Path,
        nargs="+",
        default=None,
        help="gpu: the speed table from these JSON files / folders",
    )
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="ddp: the process-group backend")
    p.add_argument("--deterministic", action="store_true", help="determinism: make_deterministic() first")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    common.set_threads(args.threads)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))), flush=True)
        return 0
    if not args.section:
        ap.error("--section is required")
    names = list(SECTIONS) if args.section == "all" else _list(args.section)
    if unknown := sorted(set(names) - set(SECTIONS)):
        ap.error(f"unknown sections {unknown}; use {list(SECTIONS)} or all")
    if args.device is None:
        args.device = "cuda" if names == ["gpu"] and args.mode != "smoke" and torch.cuda.is_available() else "cpu"
    for key in ("activations", "compile_modes", "parts", "models", "layerwise_variants", "reference_systems"):
        setattr(args, key, _list(getattr(args, key)))
    args.sho_particles = tuple(int(p) for p in _list(args.sho_particles))
    for name in names:
        t0 = time.perf_counter()
        with pi.pyro_scope():
            render_speed(args) if name == "gpu" and args.render_speed else run_section(args, SECTIONS[name])
        common.log(f"[{name}] {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
