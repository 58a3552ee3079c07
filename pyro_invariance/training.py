"""Stochastic variational inference for catalogue models: ``fit``.

``fit`` maximises the ELBO (paper 003, Eq. 10) jointly over the guide's parameters, the model's
point-estimated parameters and the symmetry parameters η, on minibatches:

    L(q, η) = (N/B) Σ_{n∈batch} E_q[log p(y_n | x_n, θ, η)] − KL(q(θ) ‖ p(θ))

with Adam and a cosine learning-rate schedule (to 0, as paper 003), a learning rate of its own for
η (and optionally for the model's other point estimates). It is written as a plain PyTorch loop
around Pyro's ``ELBO.differentiable_loss`` so that the optimiser, scheduler and every RNG can be
checkpointed and a resumed run reproduces an uninterrupted one bit-for-bit.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pyro
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import Tensor, nn
from tqdm.auto import tqdm

from pyro_invariance.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from pyro_invariance.data_utils import train_arrays
from pyro_invariance.validation import check_positive_float, check_positive_int

ELBOS: dict[str, type] = {"meanfield": TraceMeanField_ELBO, "trace": Trace_ELBO}
SCHEDULES = ("cosine", "constant")


@dataclass
class FitConfig:
    """Settings of a run (all of them are saved with checkpoints and results)."""

    steps: int = 1000
    batch_size: int | None = 128
    lr: float = 5e-2
    eta_lr: float = 1e-1
    model_lr: float | None = None
    factor_lr: float = 1e-3
    num_particles: int = 1
    elbo: str = "meanfield"
    schedule: str = "cosine"
    seed: int = 0
    device: str = "cpu"

    def validate(self) -> None:
        check_positive_int("steps", self.steps)
        if self.batch_size is not None:
            check_positive_int("batch_size", self.batch_size)
        check_positive_float("lr", self.lr)
        check_positive_float("eta_lr", self.eta_lr)
        if self.model_lr is not None:
            check_positive_float("model_lr", self.model_lr)
        check_positive_float("factor_lr", self.factor_lr)
        check_positive_int("num_particles", self.num_particles)
        if self.elbo not in ELBOS:
            raise ValueError(f"unknown elbo {self.elbo!r}; use one of {sorted(ELBOS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


@dataclass
class FitResult:
    """What ``fit`` returns: the trained model and guide, the settings and the history.

    ``history`` has one entry per step: ``step``, ``elbo`` (minibatch estimate of ELBO / N),
    ``lr`` (guide learning rate), ``eta_lr`` and ``eta`` (dict generator -> list of values).
    """

    model: nn.Module
    guide: Callable[..., Any]
    config: FitConfig
    num_data: int
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    spec: dict[str, Any] | None = None

    @property
    def final_elbo(self) -> float:
        """Mean of the last 10% of the minibatch ELBO/N estimates (a smoothed end value)."""
        values = self.history["elbo"]
        tail = values[-max(1, len(values) // 10):]
        return float(sum(tail) / len(tail))

    @property
    def eta(self) -> dict[str, float]:
        """Final symmetry parameters."""
        params = getattr(self.model, "symmetry_parameters", lambda: {})()
        return {k: float(v) for k, v in params.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (settings, history, final values)."""
        return {
            "config": asdict(self.config),
            "spec": self.spec,
            "num_data": self.num_data,
            "seconds": self.seconds,
            "final_elbo_per_datum": self.final_elbo,
            "eta": self.eta,
            "history": self.history,
        }

    def save_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))


def make_deterministic() -> None:
    """Make CUDA runs repeatable, so that ``resume=True`` continues bit-for-bit on a GPU too.

    Sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless set; it must be set before cuBLAS starts) and
    ``torch.use_deterministic_algorithms(True)`` — a process-wide switch. Measured on an H200
    (torch 2.11, a layer-wise network, MAP and Laplace fits): without it two identical runs already
    differ after 20 steps (cuDNN/atomic-add kernels); with it repeats and resumed runs are
    bit-identical. CPU runs are deterministic without it.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def is_symmetry_parameter(model: nn.Module, name: str) -> bool:
    """Model parameters trained with ``eta_lr``: leaf names starting with "eta", or listed in the
    model's ``symmetry_param_names`` attribute (e.g. ``("lam",)`` for BasisRegression)."""
    leaf = name.split(".")[-1].removesuffix("_unconstrained")
    return leaf.startswith("eta") or leaf in getattr(model, "symmetry_param_names", ())


def is_factor_parameter(name: str) -> bool:
    """Guide parameters that are off-diagonal covariance factors (unit-triangular / low-rank)."""
    leaf = name.split(".")[-1]
    return "tril" in leaf or "cov_factor" in leaf


def _param_groups(model: nn.Module, guide: nn.Module, cfg: FitConfig) -> list[dict[str, Any]]:
    """Adam parameter groups.

    guide means and scales (``lr``), guide covariance factors (``factor_lr``), symmetry η
    (``eta_lr``) and the model's other point estimates (``model_lr``, default ``lr``).
    Covariance factors get their own, smaller rate: Adam normalises their small and noisy
    gradients to steps of size ``lr``, and the resulting random walk of the H(H−1)/2 off-diagonal
    entries inflates the guide's variance (measured on rotated digits: block-Cholesky ELBO/N
    −2.4 with one rate of 0.05 for everything, −0.9 with 1e-3 for the factors).
    """
    eta, other = [], []
    for name, p in model.named_parameters():
        (eta if is_symmetry_parameter(model, name) else other).append(p)
    taken = {id(p) for p in eta + other}
    guide_named = [(n, p) for n, p in guide.named_parameters() if id(p) not in taken]
    factors = [p for n, p in guide_named if is_factor_parameter(n)]
    rest = [p for n, p in guide_named if not is_factor_parameter(n)]
    groups = [{"params": rest, "lr": cfg.lr, "name": "guide"}, {"params": factors, "lr": cfg.factor_lr, "name": "factors"}]
    if other:
        groups.append({"params": other, "lr": cfg.model_lr or cfg.lr, "name": "model"})
    if eta:
        groups.append({"params": eta, "lr": cfg.eta_lr, "name": "eta"})
    return [g for g in groups if g["params"]]


class _Batches:
    """Shuffled minibatches without replacement, epoch after epoch, from a seeded generator."""

    def __init__(self, n: int, batch_size: int | None, seed: int) -> None:
        self.n, self.batch = n, min(batch_size or n, n)
        self.gen = torch.Generator().manual_seed(seed + 7919)
        self.perm = torch.randperm(n, generator=self.gen)
        self.pos = 0

    def next(self) -> Tensor:
        if self.pos + self.batch > self.n:
            self.perm = torch.randperm(self.n, generator=self.gen)
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "perm": self.perm, "pos": self.pos}

    def load(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        self.perm, self.pos = state["perm"], state["pos"]


def _locate_non_finite(model: Any, guide: Any, args: tuple, kwargs: dict) -> str:
    """Name the first site (or parameter) with a non-finite value or log-density."""
    with torch.no_grad():
        for owner, module in (("model", model), ("guide", guide)):
            for name, p in module.named_parameters():
                if not torch.isfinite(p).all():
                    return f"{owner} parameter '{name}' is non-finite"
        try:
            guide_tr = poutine.trace(guide).get_trace(*args, **kwargs)
            model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(*args, **kwargs)
        except Exception as exc:  # the failing evaluation itself is informative
            return f"evaluating the model/guide raised {type(exc).__name__}: {exc}"
        for owner, tr in (("guide", guide_tr), ("model", model_tr)):
            for name, site in tr.nodes.items():
                if site["type"] != "sample":
                    continue
                if not torch.isfinite(site["value"]).all():
                    return f"{owner} site '{name}' has a non-finite value"
                lp = site["fn"].log_prob(site["value"])
                if not torch.isfinite(lp).all():
                    return f"{owner} site '{name}' has a non-finite log-density"
    return "no single site is non-finite (the gradient step diverged; lower the learning rates)"


def fit(
    model: nn.Module,
    guide: Any,
    data: Any,
    *,
    steps: int = 1000,
    batch_size: int | None = 128,
    lr: float = 5e-2,
    eta_lr: float = 1e-1,
    model_lr: float | None = None,
    factor_lr: float = 1e-3,
    num_particles: int = 1,
    elbo: str = "meanfield",
    schedule: str = "cosine",
    seed: int = 0,
    device: str | torch.device = "cpu",
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    until_step: int | None = None,
    progress: bool = True,
    spec: dict[str, Any] | None = None,
    callbacks: Sequence[Callable[[int, nn.Module, Any], None]] = (),
) -> FitResult:
    """Fit ``guide`` to ``model`` on ``data`` by SVI; returns a :class:`FitResult`.

    Args:
        model: a catalogue model (``model(x, y=None, num_data=None)``).
        guide: a guide object, or a guide name for :func:`pyro_invariance.guides.get`.
        data: a dataset (its training split is used) or a pair ``(x, y)``.
        steps: total number of SVI steps (the cosine schedule spans them).
        batch_size: minibatch size B (``None``: full batch); the likelihood is scaled by N/B.
        lr, eta_lr, model_lr, factor_lr: Adam learning rates for the guide's means and scales,
            for η, for the model's other point estimates (default ``lr``) and for the guide's
            off-diagonal covariance factors (see :func:`_param_groups`).
        num_particles: Monte-Carlo samples of the ELBO per step.
        elbo: ``"meanfield"`` (analytic KL where registered) or ``"trace"`` (Monte-Carlo KL).
        schedule: ``"cosine"`` (to 0) or ``"constant"``.
        seed: seeds Pyro/torch, the shuffler and hence the whole run.
        device: ``"cpu"`` or ``"cuda"``; model, guide and data are moved there.
        checkpoint_path / checkpoint_every: save a checkpoint every k steps and at the end.
        resume: continue from ``checkpoint_path`` (settings must match).
        until_step: stop after this step (checkpointing it) — to split a long run into pieces.
        progress: show a tqdm bar with the ELBO and η.
        spec: optional description of how model/guide were built (saved with the result).
        callbacks: functions ``cb(step, model, guide)`` called after every optimiser step, e.g.
            the closed-form prior-variance update of the talk,
            ``lambda step, m, g: update_prior_variance(m, g)``. State they change must live in
            the model's or guide's ``state_dict`` (buffers, parameters) to be checkpointed.

    Raises:
        FloatingPointError: the loss became NaN/inf (names the step and the site).
        CheckpointError: a checkpoint to resume from is missing, corrupt or mismatched.
    """
    cfg = FitConfig(steps, batch_size, lr, eta_lr, model_lr, factor_lr, num_particles, elbo, schedule, seed, str(device))
    cfg.validate()
    if checkpoint_every is not None:
        check_positive_int("checkpoint_every", checkpoint_every)
    if (checkpoint_every or resume or until_step) and checkpoint_path is None:
        raise ValueError("checkpoint_every, resume and until_step need checkpoint_path")
    if until_step is not None and not (1 <= until_step <= steps):
        raise ValueError(f"until_step must lie in [1, {steps}], got {until_step}")

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    x_all, y_all = train_arrays(data)
    x_all, y_all = x_all.to(dev), y_all.to(dev)
    n = x_all.shape[0]

    pyro.set_rng_seed(seed)
    model.to(dev)
    if isinstance(guide, str):
        from pyro_invariance import guides as guide_registry

        guide = guide_registry.get(guide, model)
    batches = _Batches(n, batch_size, seed)
    first = batches.perm[: batches.batch]
    # Build lazily-initialised guide parameters once, on a first batch (does not advance the shuffler).
    setup_args = (x_all[first], y_all[first])
    try:
        with poutine.block():
            guide(*setup_args, num_data=n)
    except ValueError as exc:
        where = _locate_non_finite(model, guide, setup_args, {"num_data": n})
        if "non-finite" in where:
            raise FloatingPointError(f"non-finite values before step 1: {where}") from exc
        raise
    if isinstance(guide, nn.Module):
        guide.to(dev)

    optim = torch.optim.Adam(_param_groups(model, guide, cfg))
    if schedule == "cosine":
        sched: Any = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=steps, eta_min=0.0)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda _: 1.0)
    loss_fn = ELBOS[elbo](num_particles=num_particles, vectorize_particles=False)
    history: dict[str, Any] = {"step": [], "elbo": [], "lr": [], "eta_lr": [], "eta": {}}
    for name in getattr(model, "symmetry_parameters", lambda: {})():
        history["eta"][name] = []

    start, seconds = 0, 0.0
    if resume:
        state = load_checkpoint(checkpoint_path)  # type: ignore[arg-type]
        if state["config"] != asdict(cfg):
            diff = {k: (state["config"].get(k), v) for k, v in asdict(cfg).items() if state["config"].get(k) != v}
            raise CheckpointError(f"checkpoint settings differ from this run (saved, now): {diff}")
        try:
            model.load_state_dict(state["model"])
            guide.load_state_dict(state["guide"])  # type: ignore[union-attr]
            optim.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"checkpoint does not match this model/guide: {exc}") from exc
        set_rng_state(state["rng"])
        batches.load(state["batches"])
        history, start, seconds = state["history"], state["step"], state.get("seconds", 0.0)

    def checkpoint(step: int) -> None:
        save_checkpoint(
            checkpoint_path,  # type: ignore[arg-type]
            {
                "step": step,
                "model": model.state_dict(),
                "guide": guide.state_dict(),  # type: ignore[union-attr]
                "optimizer": optim.state_dict(),
                "scheduler": sched.state_dict(),
                "rng": rng_state(),
                "batches": batches.state(),
                "config": asdict(cfg),
                "history": history,
                "seconds": seconds,
                "spec": spec,
            },
        )

    last = until_step or steps
    eta_group = next((g for g in optim.param_groups if g.get("name") == "eta"), None)
    bar = tqdm(range(start, last), initial=start, total=steps, disable=not progress, desc="SVI", leave=False)
    t0 = time.perf_counter()
    for step in bar:
        idx = batches.next().to(dev)
        args, kwargs = (x_all[idx], y_all[idx]), {"num_data": n}
        optim.zero_grad(set_to_none=True)
        try:
            loss = loss_fn.differentiable_loss(model, guide, *args, **kwargs)
        except ValueError as exc:  # distribution validation rejects NaN parameters before the loss exists
            where = _locate_non_finite(model, guide, args, kwargs)
            if "non-finite" in where:
                raise FloatingPointError(f"non-finite values at step {step + 1}: {where}") from exc
            raise
        if not torch.isfinite(loss):
            where = _locate_non_finite(model, guide, args, kwargs)
            raise FloatingPointError(f"non-finite loss ({loss.item()}) at step {step + 1}: {where}")
        loss.backward()
        optim.step()
        sched.step()
        for callback in callbacks:
            callback(step + 1, model, guide)
        elbo_value = -loss.item() / n
        history["step"].append(step + 1)
        history["elbo"].append(elbo_value)
        history["lr"].append(optim.param_groups[0]["lr"])
        history["eta_lr"].append(eta_group["lr"] if eta_group else 0.0)
        eta_now = getattr(model, "symmetry_parameters", lambda: {})()
        for name, value in eta_now.items():
            history["eta"][name].append(float(value))
        if progress:
            bar.set_postfix(elbo=f"{elbo_value:.3f}", **{k: f"{float(v):.3f}" for k, v in eta_now.items()})
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < last:
            seconds_now = seconds + time.perf_counter() - t0
            seconds, t0 = seconds_now, time.perf_counter()
            checkpoint(step + 1)
    bar.close()
    seconds += time.perf_counter() - t0
    if checkpoint_path is not None:
        checkpoint(last)
    return FitResult(model, guide, cfg, n, history, seconds, spec)

