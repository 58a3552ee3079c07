"""The steps of one :func:`~pyro_invariance.infer.training.fit` call: Adam's parameter groups, the seeded
minibatch shuffler, the lean step over this process's shards with its bulk reads of the history, the on-device
snapshots and the checked re-run that locates a divergence, and the rescue attempts' step (the lean step and the
divergence search are described in :mod:`pyro_invariance.infer.training`)."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from pyro_invariance.infer.checkpoint import (
    rng_state,
    set_rng_state,
)
from pyro_invariance.infer.config import FitConfig
from pyro_invariance.infer.distributed import Ranks, ShardStreams
from pyro_invariance.infer.divergence import first_invalid_state, first_non_finite_gradient, locate_problem
from pyro_invariance.infer.fast_step import (
    CapturedLoss,
    CaptureError,
    set_validation,
)
from pyro_invariance.infer.rescue import (
    Diverged,
    copied_state,
    one_line,
)
from pyro_invariance.models.base import symmetry_parameters, symmetry_summary
from pyro_invariance.validation import (
    num_data_kwargs,
    warn_user,
)

#: least seconds between two refreshes of the progress bar (each one reads the pending losses back)
PROGRESS_SECONDS = 1.0


def is_factor_parameter(name: str) -> bool:
    """Guide parameters that are off-diagonal covariance factors (unit-triangular / low-rank)."""
    leaf = name.split(".")[-1]
    return "tril" in leaf or "cov_factor" in leaf


def param_groups(model: nn.Module, guide: nn.Module, cfg: FitConfig) -> list[dict[str, Any]]:
    """Adam parameter groups.

    guide means and scales (``lr``), guide covariance factors (``factor_lr``), symmetry η — the
    parameter objects of ``model.symmetry_parameters()``, by identity — (``eta_lr``) and the
    model's other point estimates (``model_lr``, default ``lr``).
    Covariance factors get their own, smaller rate: Adam normalises their small and noisy
    gradients to steps of size ``lr``, and the resulting random walk of the H(H−1)/2 off-diagonal
    entries inflates the guide's variance (measured on rotated digits: block-Cholesky ELBO/N
    −2.4 with one rate of 0.05 for everything, −0.9 with 1e-3 for the factors).
    """
    eta_ids = {id(p) for p in symmetry_parameters(model)}  # by identity: the objects the model declares
    eta, other = [], []
    for p in model.parameters():
        (eta if id(p) in eta_ids else other).append(p)
    if len(eta) != len(eta_ids):
        raise ValueError(
            f"{type(model).__name__}.symmetry_parameters() returned objects that are not parameters of the model"
        )
    taken = {id(p) for p in eta + other}
    guide_named = [(n, p) for n, p in guide.named_parameters() if id(p) not in taken]
    factors = [p for n, p in guide_named if is_factor_parameter(n)]
    rest = [p for n, p in guide_named if not is_factor_parameter(n)]
    groups = [
        {"params": rest, "lr": cfg.lr, "name": "guide"},
        {"params": factors, "lr": cfg.factor_lr, "name": "factors"},
    ]
    if other:
        groups.append({"params": other, "lr": cfg.model_lr or cfg.lr, "name": "model"})
    if eta:
        groups.append({"params": eta, "lr": cfg.eta_lr, "name": "eta"})
    return [g for g in groups if g["params"]]


class Batches:
    """Shuffled minibatches without replacement, epoch after epoch, from a seeded generator; with ``group``,
    of whole groups of ``group`` consecutive rows (the groups are shuffled, their rows kept together)."""

    def __init__(
        self, n: int, batch_size: int | None, seed: int, device: torch.device | str = "cpu", group: int | None = None
    ) -> None:
        self.n, self.batch, self.group = n, min(batch_size or n, n), group
        if group is not None and (n % group or self.batch % group):
            raise ValueError(
                f"batch_group={group} must divide the {n} rows of the data and the minibatch of {self.batch} rows"
            )
        self.gen = torch.Generator().manual_seed(seed + 7919)
        self.perm = self._permutation()
        self.pos = 0
        self.device = torch.device(device)
        self._perm_on_device: Tensor | None = None  # one copy per epoch, not one transfer per step

    def next(self) -> Tensor:
        """The next minibatch's row indices, on ``device`` (every minibatch has ``batch`` rows)."""
        if self.pos + self.batch > self.n:
            self.perm = self._permutation()
            self.pos, self._perm_on_device = 0, None
        if self._perm_on_device is None:
            self._perm_on_device = self.perm.to(self.device)
        idx = self._perm_on_device[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return idx

    def _permutation(self) -> Tensor:
        """A permutation of the rows: of rows one by one, or of whole groups (group g's rows g·G … g·G + G − 1)."""
        if self.group is None:
            return torch.randperm(self.n, generator=self.gen)
        groups = torch.randperm(self.n // self.group, generator=self.gen)
        return (groups.unsqueeze(1) * self.group + torch.arange(self.group)).reshape(-1)

    def state(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "perm": self.perm, "pos": self.pos}

    def load(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        self.perm, self.pos, self._perm_on_device = state["perm"], state["pos"], None


@dataclass
class RunState:
    """What a run's steps change, together: the model and guide, the optimiser and its schedule, the shuffler
    and the shards' random streams (``None`` without shards); with Pyro's global random state, everything a
    bit-for-bit resume restores."""

    model: nn.Module
    guide: Any
    optim: Any
    sched: Any
    batches: Batches
    streams: ShardStreams | None

    def saved(self, with_guide: bool = True) -> dict[str, Any]:
        """The checkpoint payload's state entries (the shards' streams are gathered by the caller);
        ``with_guide=False`` leaves out the guide's (a guide that is not a module has none to snapshot)."""
        return {
            "model": self.model.state_dict(),
            **({"guide": self.guide.state_dict()} if with_guide else {}),
            "optimizer": self.optim.state_dict(),
            "scheduler": self.sched.state_dict(),
            "rng": rng_state(),
            "batches": self.batches.state(),
        }

    def load(self, payload: dict[str, Any]) -> None:
        """Load a checkpoint payload's state (model, guide, optimiser, schedule, every random stream); a
        checkpoint always holds the guide's (:func:`~pyro_invariance.infer.checkpoint.load_checkpoint` checks)."""
        self.model.load_state_dict(payload["model"])
        if "guide" in payload:
            self.guide.load_state_dict(payload["guide"])
        self.optim.load_state_dict(payload["optimizer"])
        self.sched.load_state_dict(payload["scheduler"])
        set_rng_state(payload["rng"])
        self.batches.load(payload["batches"])
        if self.streams is not None:  # the shards' streams, whichever processes advanced them
            self.streams.load(payload["shard_rng"])

    def rebase_rates(self, new_base: Sequence[float]) -> None:
        """New base learning rates for the parameter groups, at the same position in the schedule."""
        for group, base_now, base_saved in zip(self.optim.param_groups, new_base, self.sched.base_lrs):
            group["lr"] = base_now * (group["lr"] / base_saved if base_saved else 1.0)
            group["initial_lr"] = base_now
        self.sched.base_lrs = list(new_base)


class Snapshot:
    """A run's state after ``step``, copied on the device (:meth:`RunState.saved` with the shards' streams), to
    re-run the steps after it with checks."""

    def __init__(self, step: int, run: RunState) -> None:
        self.step = step
        self.state = copied_state(run.saved(with_guide=isinstance(run.guide, nn.Module)))
        if run.streams is not None:
            self.state["shard_rng"] = run.streams.copy_states()

    def restore(self, run: RunState) -> None:
        run.load(copied_state(self.state))  # copied again: a snapshot may be restored more than once


class StepLoop:
    """The steps of one ``fit`` call: the lean step over this process's shards, the bulk reads of its
    history, the snapshots and the re-run that locates a divergence (see :mod:`pyro_invariance.infer.training`)."""

    def __init__(
        self,
        run: RunState,
        cfg: FitConfig,
        dev: torch.device,
        x_all: Tensor,
        y_all: Tensor,
        loss_fn: Any,
        callbacks: Sequence[Callable[..., None]],
        history: dict[str, Any],
        *,
        ranks: Ranks,
        engine: Callable[..., Tensor],
        compile_mode: tuple[str, str | None] | None = None,
    ) -> None:
        self.run, self.ranks, self.streams, self.engine = run, ranks, run.streams, engine
        # the mode this call runs (compile="auto" resolved; auto_compile), and why auto chose eager
        self.mode, why = compile_mode or (cfg.compile, None)
        self.auto = cfg.compile == "auto"
        # this process's shards (None: the whole minibatch on the global stream, as before shards existed)
        self.own: list[int | None] = list(ranks.own_shards(cfg.shards)) if run.streams is not None else [None]
        self.model, self.guide, self.cfg, self.dev = run.model, run.guide, cfg, dev
        self.x_all, self.y_all, self.num_data = x_all, y_all, x_all.shape[0]
        self.kwargs = num_data_kwargs(run.model, self.num_data)  # Pyro's plain model(x, y=None) takes none
        self.optim, self.sched, self.batches = run.optim, run.sched, run.batches
        self.loss_fn, self.callbacks = loss_fn, callbacks
        self.history = history
        self.eta_names = list(history["eta"])
        self.eta_group = next((g for g in run.optim.param_groups if g.get("name") == "eta"), None)
        self.pending: dict[str, list[Any]] = {"step": [], "lr": [], "eta_lr": [], "loss": [], "eta": []}
        self.snapshot: Snapshot | None = None
        self.captured: CapturedLoss | None = None
        self.capture_tried = self.mode == "off"
        self.validating: bool | None = None  # the validation state this loop last set
        self.last_read = time.perf_counter()
        self.bar: Any = None
        self.stats: dict[str, Any] = {"compile": self.mode, "snapshots": 0, **({"auto": why} if why else {})}

    # -- one step --------------------------------------------------------------------------------
    def _validation(self, on: bool) -> None:
        if self.validating is not on:
            set_validation(on)
            self.validating = on

    def _locate(self, args: tuple[Tensor, Tensor]) -> str | None:
        self._validation(True)
        return locate_problem(self.model, self.guide, args, self.kwargs)

    def step(self, step: int, checked: bool, rerun: bool = False) -> None:
        """Step ``step + 1``. ``checked``: Pyro's validation on (for the eager ELBO) and the loss read
        and checked before the update, as the eager step does. ``rerun``: re-running it to
        locate a divergence (nothing is recorded)."""
        if not checked and not rerun and (self.snapshot is None or step - self.snapshot.step >= self.cfg.log_every):
            if self.cfg.validation == "first-step" and not self.ranks.ddp:
                self.flush()  # every step up to here has a finite loss
                self.snapshot = Snapshot(step, self.run)
                self.stats["snapshots"] += 1
        idx = self.batches.next()
        x, y = self.x_all[idx], self.y_all[idx]
        self.optim.zero_grad(set_to_none=True)
        # this process's shards, each on its stream (None: the whole minibatch on the global stream, the
        # step of before shards existed); DDP averages the gradients after the last one
        b, k, losses = x.shape[0] // self.cfg.shards, len(self.own), []
        for j, s in enumerate(self.own):
            sync = self.engine.no_sync() if self.ranks.ddp and j + 1 < k else contextlib.nullcontext()  # type: ignore[attr-defined]
            rows = slice(None) if s is None else slice(s * b, (s + 1) * b)
            with sync, self.streams.stream(s) if s is not None else contextlib.nullcontext():  # type: ignore[union-attr]
                loss_s = self._checked_loss(step, x[rows], y[rows], checked, rerun)
                (loss_s if k == 1 else loss_s / k).backward()
            losses.append(loss_s.detach())
        loss = losses[0] if k == 1 else sum(losses[1:], losses[0]) / k
        self.optim.step()
        self.sched.step()
        for callback in self.callbacks:
            callback(step + 1, self.model, self.guide)
        if rerun:
            return
        p = self.pending
        p["step"].append(step + 1)
        p["loss"].append(loss.detach())
        p["lr"].append(self.optim.param_groups[0]["lr"])
        p["eta_lr"].append(self.eta_group["lr"] if self.eta_group else 0.0)
        if self.eta_names:
            eta_now = symmetry_summary(self.model, self.guide)
            values = [eta_now[k].detach().reshape(()) for k in self.eta_names]
            if len({v.dtype for v in values}) > 1:  # float() of each is exact in float64
                values = [v.to(torch.float64) for v in values]
            p["eta"].append(torch.stack(values))

    def _checked_loss(self, step: int, x: Tensor, y: Tensor, checked: bool, rerun: bool) -> Tensor:
        """:meth:`_loss`, and with ``checked`` the loss read and checked (on every rank together)."""
        error: str | None = None
        loss = None
        try:
            loss = self._loss(x, y, checked, rerun)
        except ValueError as exc:  # distribution validation rejects invalid parameters before the loss exists
            if not self.ranks.ddp:
                where = self._locate((x, y)) or f"{type(exc).__name__}: {exc}"
                raise Diverged(f"invalid values at step {step + 1}: {where}", step + 1) from exc
            error = f"invalid values at step {step + 1}: {type(exc).__name__}: {exc}"
        if checked and error is None and not bool(torch.isfinite(loss)):  # type: ignore[arg-type]
            where = self._locate((x, y)) or "the gradient step diverged"
            error = f"non-finite loss ({loss.item()}) at step {step + 1}: {where}"  # type: ignore[union-attr]
        if checked or error is not None:
            error = self.ranks.agree(error)
        if error is not None:
            raise Diverged(error, step + 1)
        return loss  # type: ignore[return-value]

    def _loss(self, x: Tensor, y: Tensor, checked: bool, rerun: bool) -> Tensor:
        """The ELBO's loss on (x, y): eager Pyro (validation as ``checked`` says) or the captured graph."""
        if not checked and not self.capture_tried:
            self.capture_tried = True
            self._validation(False)
            try:
                self.captured = CapturedLoss.capture(
                    self.loss_fn, self.model, self.guide, x, y, self.kwargs, self.mode, self.dev
                )
                self.stats.update(
                    compile=self.captured.mode,
                    capture_seconds=self.captured.capture_seconds,
                    bit_identical=self.captured.bit_identical,
                )
            except CaptureError as exc:
                self._fall_back(str(exc))
            if self.auto and self.captured is not None and not self.captured.bit_identical:
                self._fall_back("the captured loss is not bit-identical to Pyro's")
        # a re-run replays the captured graph only where eager Pyro would draw other numbers
        use_graph = self.captured is not None and (not checked or (rerun and not self._eager_equals_graph()))
        if use_graph:
            try:
                loss = self.captured(x, y)  # type: ignore[misc]
            except CaptureError as exc:
                self._fall_back(str(exc))
            else:
                if self.captured is not None and self.captured.compile_seconds is not None:
                    self.stats.update(compile=self.captured.mode, compile_seconds=self.captured.compile_seconds)
                    if self.captured.failure is not None:
                        self.stats.update(fallback=self.captured.failure)
                return loss
        self._validation(checked)
        return self.engine(x, y, **self.kwargs)  # Pyro's ELBOModule (in DDP on the ranks of a process group)

    def _eager_equals_graph(self) -> bool:
        return self.captured is not None and self.captured.mode == "capture" and self.captured.bit_identical

    def _fall_back(self, reason: str) -> None:
        """Run eagerly from now on: with a warning where the mode was asked for, silently for ``"auto"``."""
        self.captured = None
        if self.auto:
            self.stats.update(compile="off", auto=reason)
            return
        warn_user(f"compile={self.cfg.compile!r}: {reason}; running the eager Pyro step instead", RuntimeWarning)
        self.stats.update(compile="off", fallback=reason)

    # -- bulk reads -------------------------------------------------------------------------------
    def stop_requested(self, signum: int | None, done: int) -> bool:
        """Whether to stop after step ``done`` for a SIGINT/SIGTERM. The ranks of a data-parallel run
        agree on it at each bulk read (every ``log_every`` steps), so that all stop at the same step."""
        if not self.ranks.ddp:
            return signum is not None
        return done % self.cfg.log_every == 0 and self.ranks.any(signum is not None, self.dev)

    def flush_due(self, progress: bool) -> bool:
        waiting = len(self.pending["step"])
        if self.ranks.ddp:  # the ranks read at the same steps (a read averages their losses)
            return waiting >= self.cfg.log_every
        return waiting >= self.cfg.log_every or (
            progress and waiting > 0 and time.perf_counter() - self.last_read >= PROGRESS_SECONDS
        )

    def flush(self) -> None:
        """Read the pending steps' losses and η back (one transfer each), check that the losses are
        finite (else locate the divergence: raises) and append them to the history."""
        p = self.pending
        self.last_read = time.perf_counter()
        if not p["step"]:
            return
        losses = self.ranks.mean(torch.stack(p["loss"])).tolist()  # the ranks' shards averaged
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is not None:
            self._locate_divergence(p["step"][bad], losses[bad])
        etas = torch.stack(p["eta"]).tolist() if self.eta_names else []
        n, h = self.num_data, self.history
        h["step"].extend(p["step"])
        h["elbo"].extend(-v / n for v in losses)
        h["lr"].extend(p["lr"])
        h["eta_lr"].extend(p["eta_lr"])
        for j, name in enumerate(self.eta_names):
            h["eta"][name].extend(row[j] for row in etas)
        if self.bar is not None and not self.bar.disable:
            self.bar.update(len(p["step"]))
            self.bar.set_postfix(elbo=f"{h['elbo'][-1]:.3f}", **{k: f"{h['eta'][k][-1]:.3f}" for k in self.eta_names})
        for values in p.values():
            values.clear()

    def _locate_divergence(self, bad_step: int, value: float) -> None:
        """Restore the last snapshot and re-run the steps up to ``bad_step`` with checks: the checked
        step raises at the first invalid step. Raises here if the re-run does not reproduce it."""
        for values in self.pending.values():
            values.clear()
        snap = self.snapshot
        if self.ranks.ddp:
            what = (
                f"non-finite loss ({value}) at step {bad_step}, found by the bulk check; a data-parallel run does not "
                f"re-run steps to locate it (resume the last checkpoint in one process with shards={self.cfg.shards} "
                "and validation='always' to find the site)"
            )
        elif snap is not None and snap.step < bad_step:
            snap.restore(self.run)
            for step in range(snap.step, bad_step):
                self.step(step, checked=True, rerun=True)
            what = (
                f"non-finite loss ({value}) at step {bad_step}, found by the bulk check; re-running steps "
                f"{snap.step + 1}-{bad_step} with checks did not reproduce it (is the device deterministic? see "
                "make_deterministic)"
            )
        else:  # pragma: no cover - every unchecked step follows a snapshot
            what = f"non-finite loss ({value}) at step {bad_step}, found by the bulk check"
        raise Diverged(what, bad_step)

    # -- rescue -----------------------------------------------------------------------------------
    def attempt(self, payload: dict[str, Any], plan: dict[str, float], end: int) -> str | None:
        """Load ``payload`` with the learning rates of ``plan`` (as a resume with ``allow_changes`` does) and
        run the steps after it through ``end``, each checked: the first problem, or ``None``."""
        self.run.load(payload)
        self.run.rebase_rates([g["lr"] for g in param_groups(self.model, self.guide, replace(self.cfg, **plan))])
        with warnings.catch_warnings():  # a trial's NaN warnings are its verdict, reported in one line, not the run's
            warnings.simplefilter("ignore")
            for step in range(int(payload["step"]), end):
                try:
                    self.step(step, checked=True, rerun=True)
                except Diverged as exc:
                    return exc.what
                except (ValueError, RuntimeError) as exc:  # e.g. a factorisation of non-finite values
                    return f"at step {step + 1}: {one_line(exc)}"
                bad = first_non_finite_gradient(self.model, self.guide) or first_invalid_state(
                    self.model, self.guide, self.optim
                )
                if bad is not None:
                    return f"after step {step + 1}: {bad}"
        return None
