"""Stochastic variational inference for catalogue models: ``fit``.

``fit`` maximises the ELBO (paper 003, Eq. 10) jointly over the guide's parameters, the model's
point-estimated parameters and the symmetry parameters η, on minibatches::

    L(q, η) = (N/B) Σ_{n∈batch} E_q[log p(y_n | x_n, θ, η)] − KL(q(θ) ‖ p(θ))

with Adam and a cosine learning-rate schedule (to 0, as paper 003), a learning rate of its own for
η (and optionally for the model's other point estimates). It is written as a plain PyTorch loop
around Pyro's ``ELBO.differentiable_loss`` so that the optimiser, scheduler and every RNG can be
checkpointed and a resumed run reproduces an uninterrupted one bit-for-bit.

**The lean step**. A step does no host synchronisation: the ELBO is Pyro's computed
without reading the loss back (:mod:`pyro_invariance.infer.fast_step`), the losses and η values of
each step stay on the device and are read in bulk every ``log_every`` steps (and for the progress
bar at most once a second, at checkpoints, interrupts and the end) into the same per-step history as
before. The data are checked once at the API boundary; Pyro's validation runs on the first step of
each call (the model/guide pair is checked once, with an immediate check of the loss) and is then
switched off (``validation="always"`` keeps it on, with the loss checked after every step, the slower
path); Pyro's and torch's validation flags are restored when ``fit`` returns. Adam is fused.

**Divergence without a per-step check.** Every ``log_every`` steps, before a step, the state (model,
guide, optimiser, schedule, RNGs, shuffler) is copied on the device. When a bulk read finds a
non-finite loss, ``fit`` restores the last copy and re-runs the steps since then with validation on
and the loss checked after every step; runs are deterministic (CPU; CUDA after
:func:`make_deterministic`), so the re-run stops at the first bad step with the same error, step and
site as a fully checked run, and leaves the model and guide in the state before that step. The
copies cost one set of parameters and optimiser moments in memory (``validation="always"``
makes none).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor, nn
from tqdm.auto import tqdm

import pyro_invariance.guides as guide_registry
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.guides.base import check_guide_for
from pyro_invariance.infer.auto_compile import resolve_compile
from pyro_invariance.infer.checkpoint import (
    CheckpointError,
    atomic_write_text,
    load_checkpoint,
    peek_step,
    save_checkpoint,
)
from pyro_invariance.infer.config import FitConfig, resolve_config
from pyro_invariance.infer.distributed import Ranks, ShardStreams, setup_ranks
from pyro_invariance.infer.divergence import first_invalid_state, locate_problem
from pyro_invariance.infer.fast_step import (
    LEAN_ELBOS,
    LeanRWS_ELBO,
    make_optimizer,
    preserved_validation,
    tf32_matmuls,
    torch_threads,
)
from pyro_invariance.infer.fingerprint import fingerprint_differences, run_fingerprint
from pyro_invariance.infer.interrupts import FitInterrupted, StopSignals
from pyro_invariance.infer.rescue import (
    Diverged,
    Outcome,
    RescuePoints,
    describe_failures,
    rate_plans,
    resume_hint,
    search,
)
from pyro_invariance.infer.runlock import RunLock
from pyro_invariance.infer.step_loop import (
    Batches,
    RunState,
    Snapshot,
    StepLoop,
    param_groups,
)
from pyro_invariance.models.base import symmetry_parameters, symmetry_summary, vectorizable_particles
from pyro_invariance.validation import (
    check_positive_int,
    first_overflowed_state,
    num_data_kwargs,
    takes_num_data,
    warn_user,
)

#: settings that do not change a run's numbers: left out of its fingerprint, so a resumed run may change them
RESULT_NEUTRAL = ("validation", "log_every", "strategy")


@dataclass
class FitResult:
    """What ``fit`` returns: the trained model and guide, the settings and the history.

    ``history`` has one entry per step: ``step``, ``elbo`` (minibatch estimate of ELBO / N),
    ``lr`` (guide learning rate), ``eta_lr`` and ``eta`` (dict generator -> list of values).
    ``step_stats`` says how the steps ran (not saved by :meth:`to_dict`): ``compile`` (the mode
    used, after any fallback), ``capture_seconds`` / ``compile_seconds`` / ``bit_identical`` when
    the loss was captured, ``fallback`` (why it was not), ``snapshots`` (state copies taken).
    """

    model: nn.Module
    guide: Callable[..., Any]
    config: FitConfig
    num_data: int
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    spec: dict[str, Any] | None = None
    step_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def final_elbo(self) -> float:
        """Mean of the last 10% of the minibatch ELBO/N estimates (a smoothed end value)."""
        values = self.history["elbo"]
        tail = values[-max(1, len(values) // 10) :]
        return float(sum(tail) / len(tail))

    @property
    def eta(self) -> dict[str, float]:
        """Final symmetry values, ``model.symmetry_summary()`` as floats (a latent η: the guide's
        median; ``{}`` for a model that is not a :class:`~pyro_invariance.models.base.CatalogueModel`)."""
        return {k: float(v) for k, v in symmetry_summary(self.model, self.guide).items()}

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
        """Write :meth:`to_dict` as JSON, atomically (a crash never leaves half a file)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))


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


def is_symmetry_parameter(model: nn.Module, param: Tensor) -> bool:
    """Whether ``param`` is trained with ``eta_lr``: it is one of ``model.symmetry_parameters()``
    (:class:`~pyro_invariance.models.base.CatalogueModel`), compared by identity. A model that is not
    a ``CatalogueModel`` has none: all its parameters train at ``model_lr``."""
    return any(param is p for p in symmetry_parameters(model))


LR_SETTINGS = ("lr", "eta_lr", "model_lr", "factor_lr")


def _divergence_message(what: str, last_good: tuple[Path, int] | None) -> str:
    """The message of a divergence whose checkpoint was not checked (no checkpoint, or a data-parallel run)."""
    if last_good is None:
        return f"{what}; no checkpoint was written before it"
    path, step = last_good
    return (
        f"{what}; the last finite checkpoint {str(path)!r} (step {step}) is kept (a data-parallel run does not "
        "check that it trains on): resume it with lower learning rates (fit(..., resume=True, "
        "allow_changes=['lr']); CLI: --resume --allow-change lr)"
    )


def _rescue_message(what: str, path: Path, found: Outcome, written: int | None) -> str:
    """The message of a divergence once the kept states were checked (:mod:`~pyro_invariance.infer.rescue`);
    ``written``: the step of the newest checkpoint written before it."""
    tried = f"from {describe_failures(found.failed)}" if found.failed else ""
    if found.payload is not None and found.plan is not None:
        step = int(found.payload["step"])
        label = "step 0, the start of the run" if step == 0 else f"step {step}"
        back = f" (rolled back from step {written}: {tried})" if written not in (None, step) and tried else ""
        rates = ", ".join(f"{k}={v:g}" for k, v in found.plan.items())
        kept = "is kept" if written is not None else "is written"
        return (
            f"{what}; the last finite checkpoint that trains on, {str(path)!r} ({label}) {kept}{back}: from it, "
            f"steps {step + 1}-{found.end} ran with finite losses, gradients and state at {rates} (10x lower); "
            f"resume it so: {resume_hint(found.plan)}"
        )
    older = "; older ones were not checked (the check's budget of steps is spent)" if found.unchecked else ""
    kept = (
        f"the last finite checkpoint {str(path)!r} (step {written}) is kept, but "
        if written is not None
        else "no checkpoint is kept: "
    )
    return (
        f"{what}; {kept}no kept state trains on with 10x lower learning rates through step {found.end}"
        f"{f' ({tried})' if tried else ''}{older}: start again with lower learning rates (overwrite=True; "
        "CLI: --overwrite)"
    )


def _check_run_args(
    cfg: FitConfig,
    checkpoint_path: Any,
    checkpoint_every: int | None,
    resume: bool,
    until_step: int | None,
    overwrite: bool,
    allow_changes: Sequence[str],
) -> None:
    cfg.validate()
    if checkpoint_every is not None:
        check_positive_int("checkpoint_every", checkpoint_every)
    if (checkpoint_every or resume or until_step or allow_changes) and checkpoint_path is None:
        raise ValueError("checkpoint_every, resume, until_step and allow_changes need checkpoint_path")
    if until_step is not None and not (isinstance(until_step, int) and 1 <= until_step <= cfg.steps):
        raise ValueError(f"until_step must be an integer in [1, {cfg.steps}], got {until_step!r}")
    if resume and overwrite:
        raise ValueError("resume=True continues the saved run and overwrite=True replaces it: pass one of them")
    unknown = sorted(set(allow_changes) - set(LR_SETTINGS))
    if unknown:
        raise ValueError(f"allow_changes may name only learning rates {LR_SETTINGS}, got {unknown}")
    if allow_changes and not resume:
        raise ValueError("allow_changes applies to resume=True only")


def _refuse_existing(path: Path) -> None:
    """A finished or interrupted run at ``path`` is never replaced silently."""
    if path.exists():
        step = peek_step(path)
        what = f"holds step {step}" if step is not None else "is not a readable checkpoint"
        raise CheckpointError(
            f"checkpoint {str(path)!r} already exists and {what}: pass resume=True to continue it or "
            "overwrite=True to replace it (CLI: --resume / --overwrite)"
        )


def _restore(
    state: dict[str, Any],
    fingerprint: dict[str, Any],
    run: RunState,
    until_step: int | None,
    allow_changes: Sequence[str],
) -> None:
    """Check that ``state`` belongs to this run, then load it (learning rates as allowed)."""
    differences = fingerprint_differences(state["fingerprint"], fingerprint, ignore_config=allow_changes)
    if differences:
        raise CheckpointError("checkpoint belongs to another run: " + "; ".join(differences))
    if until_step is not None and until_step < state["step"]:
        raise CheckpointError(
            f"until_step={until_step} is below the checkpoint's step {state['step']}: "
            "a run cannot go back; pick a later until_step"
        )
    new_base = [g["lr"] for g in run.optim.param_groups]
    try:
        run.load(state)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint does not match this model/guide: {exc}") from exc
    if allow_changes:
        run.rebase_rates(new_base)


@pyro_scope()
def fit(
    model: nn.Module,
    guide: Any,
    data: Any,
    config: FitConfig | None = None,
    *,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    allow_changes: Sequence[str] = (),
    until_step: int | None = None,
    progress: bool = True,
    spec: dict[str, Any] | None = None,
    run_settings: dict[str, Any] | None = None,
    callbacks: Sequence[Callable[[int, nn.Module, Any], None]] = (),
    **overrides: Any,
) -> FitResult:
    """Fit ``guide`` to ``model`` on ``data`` by SVI; returns a :class:`FitResult`.

    Args:
        model: a Pyro model ``model(x, y=None)``, e.g. a ``PyroModule``: a catalogue model, or one of
            the user's own. A model that also takes ``num_data`` (the catalogue's) is fitted on
            minibatches and scales its likelihood by ``N/B``; one that does not is fitted full batch
            (a warning says so when ``batch_size`` came from the defaults; an explicit minibatch is
            refused), since it scores the rows it is given as the whole data set.
        guide: a guide object, or a guide name for :func:`pyro_invariance.guides.get`.
        data: a dataset (its training split is used) or a pair ``(x, y)`` of tensors or arrays;
            checked and converted once, before any step (:func:`pyro_invariance.data.arrays.train_arrays`).
        config: the training settings (:class:`~pyro_invariance.infer.config.FitConfig`), taken as
            given; ``None`` (default): the library defaults updated by the guide's and then the
            model's ``fit_defaults`` (:meth:`FitConfig.recommended`).
        **overrides: :class:`FitConfig` fields that override the above (``steps=300, lr=0.01``):
            ``steps``, ``batch_size`` (``None``: full batch; the likelihood is scaled by N/B),
            ``batch_group`` (minibatches of whole groups of that many consecutive rows), the
            Adam rates ``lr``, ``eta_lr``, ``model_lr``, ``factor_lr`` (see :func:`param_groups`),
            ``num_particles``, ``elbo`` (``"meanfield"``/``"trace"``/``"iwae"``/``"rws"``), ``schedule``
            (``"cosine"``/``"constant"``), ``seed`` (seeds Pyro/torch, the shuffler and hence the
            whole run) and ``device`` (model, guide and data are moved there); how fast a step runs:
            ``validation`` (``"first-step"``: Pyro's validation on the first step of this call, then
            off; ``"always"``: on every step, the loss checked after each), ``log_every`` (bulk reads
            of the history and state snapshots), ``compile`` (``"auto"``: ``"capture"`` where the model
            declares it safe, the call runs at least
            :data:`~pyro_invariance.infer.auto_compile.AUTO_CAPTURE_STEPS` steps and the replay equals
            Pyro's to the bit, else ``"off"``, silently; ``"off"``: eager Pyro; ``"capture"``: the loss
            replayed from a captured graph, the same numbers; ``"inductor"`` or ``True``:
            ``torch.compile`` of that graph, other random draws; ``"cudagraphs"``: that graph's forward
            and backward replayed as CUDA graphs, other random draws; each falls back with a warning
            where the loss cannot be captured, compiled or recorded, see
            :mod:`pyro_invariance.infer.fast_step`),
            ``tf32`` (CUDA) and ``threads`` (torch threads during the call, restored after).
        checkpoint_path: save a checkpoint there every ``checkpoint_every`` steps and at the end. While
            the run writes it, the checkpoint is locked against other processes
            (:class:`~pyro_invariance.infer.runlock.RunLock`); writes are atomic.
        resume: continue from ``checkpoint_path``. The run's fingerprint (model and guide settings
            and buffers, these settings, the data; :mod:`pyro_invariance.infer.fingerprint`) must match.
        overwrite: replace an existing checkpoint at ``checkpoint_path`` (otherwise refused).
        allow_changes: with ``resume``, learning-rate settings (``"lr"``, ``"eta_lr"``,
            ``"model_lr"``, ``"factor_lr"``) that may differ from the saved run — to rescue a
            diverged run from the checkpoint its error names. The schedule keeps its position.
        until_step: stop after this step (checkpointing it) — to split a long run into pieces.
        progress: show a tqdm bar with the ELBO and η.
        spec: optional description of how model/guide were built (saved with the result).
        run_settings: other settings that define the run (e.g. a callback's), saved in the
            fingerprint and compared on resume.
        callbacks: functions ``cb(step, model, guide)`` called after every optimiser step, e.g.
            the closed-form prior-variance update of the talk,
            ``lambda step, m, g: update_prior_variance(m, g)``. State they change must live in
            the model's or guide's ``state_dict`` (buffers, parameters) to be checkpointed.

    A non-finite loss stops the run at the first step that has one, naming the step and the site
    as a run checked after every step would (module docstring: "Divergence without a per-step
    check"); the model and guide are left in the state before that step.

    **A checkpoint a diverged run can continue from.** With ``checkpoint_path`` (one process), the
    state at the start of the call and the newest checkpoints' states (8 in all, thinning out with
    age) are kept in host memory. On a divergence at step ``b`` they are re-run, newest first, with
    ``lr`` 10× lower (then every rate 10× lower), through step ``b + 5``, each step's loss,
    gradients and new state checked; the first that passes is written to ``checkpoint_path``
    (replacing the newer, doomed checkpoint; no other file is written) and the error names it with
    the resume that was checked, e.g. ``fit(..., resume=True, allow_changes=['lr'], lr=0.3)``; on
    the CPU that resume repeats the checked steps bit-for-bit. If none passes, the error says so and
    the file is left as it was. The check re-runs at most max(100, 4 × the steps since the newest
    kept state) steps and calls ``callbacks`` as the steps do (:mod:`pyro_invariance.infer.rescue`);
    a data-parallel run skips it and names its last finite checkpoint unchecked.

    SIGINT and SIGTERM stop the run after the current step, write the checkpoint and raise
    :class:`~pyro_invariance.infer.interrupts.FitInterrupted` (see :mod:`pyro_invariance.infer.interrupts`).

    Raises:
        FloatingPointError: the loss or the parameters became non-finite, or a distribution got
            invalid parameters (names the step, the site and the checked checkpoint to resume
            with lower learning rates, see above: a non-finite state is never written).
        CheckpointError: a checkpoint to resume from is missing, corrupt or from another run; an
            existing checkpoint would be overwritten; a write failed (the previous file is kept).
        RunLockedError: another process is writing the same checkpoint.
        FitInterrupted: SIGINT/SIGTERM (a ``KeyboardInterrupt``).
    """
    if isinstance(guide, str):
        guide = guide_registry.get(guide, model)
    check_guide_for(model, guide)  # a guide built for another model fails here, not at step 1
    cfg = resolve_config(config, model, guide, overrides)
    allow_changes = tuple(allow_changes)
    _check_run_args(cfg, checkpoint_path, checkpoint_every, resume, until_step, overwrite, allow_changes)
    ranks, device = setup_ranks(cfg.strategy, cfg.device)
    dev = torch.device(device)
    x_all, y_all = train_arrays(data, model)
    cfg = _batch_for_model(cfg, model, x_all.shape[0], explicit="batch_size" in overrides or config is not None)
    path = Path(checkpoint_path) if checkpoint_path is not None else None
    with contextlib.ExitStack() as stack:
        if path is not None:  # rank 0 writes the checkpoints: it alone locks and checks the path

            def claim() -> None:
                stack.enter_context(RunLock(path))
                if not resume and not overwrite:
                    _refuse_existing(path)

            ranks.together(claim if ranks.is_main else lambda: None)
        stack.enter_context(preserved_validation())  # the loop switches Pyro's validation; restored here
        stack.enter_context(tf32_matmuls(dev, cfg.tf32))
        stack.enter_context(torch_threads(cfg.threads))
        return _fit_locked(
            model,
            guide,
            x_all,
            y_all,
            cfg,
            dev,
            ranks,
            path,
            checkpoint_every,
            resume,
            allow_changes,
            until_step,
            progress,
            spec,
            run_settings,
            callbacks,
        )


def _batch_for_model(cfg: FitConfig, model: Any, n: int, explicit: bool) -> FitConfig:
    """The settings for a model that takes no ``num_data`` (Pyro's plain ``model(x, y=None)``): it scores
    the rows it is given as the whole data set, so a minibatch would weigh the prior ``N/B`` times too
    much. Full batch then; a minibatch asked for explicitly is refused in one line."""
    if takes_num_data(model) or cfg.batch_size is None or cfg.batch_size >= n:
        return cfg
    needs = (
        "the model takes no num_data, so it would score a minibatch of rows as the whole data set; fit "
        "full batch (batch_size=None; CLI --batch-size full), or let forward take num_data=None and use "
        "pyro.plate('data', num_data, subsample_size=len(x))"
    )
    if explicit:
        raise ValueError(f"batch_size={cfg.batch_size} of {n} rows: {needs}")
    warn_user(f"fitting all {n} rows per step (not batch_size={cfg.batch_size}): {needs}", UserWarning)
    return cfg.replace(batch_size=None)


def set_up_guide(model: nn.Module, guide: Any, x: Tensor, y: Tensor, num_data: int) -> None:
    """Create a lazily initialised guide's parameters: one call on rows ``(x, y)`` of a data set of
    ``num_data`` rows, its sample sites blocked (it draws from the global random stream). Invalid
    values found there are named (``FloatingPointError``)."""
    kwargs = num_data_kwargs(model, num_data)
    try:
        with poutine.block():
            guide(x, y, **kwargs)
    except ValueError as exc:
        where = locate_problem(model, guide, (x, y), kwargs)
        if where:
            raise FloatingPointError(f"invalid values before step 1: {where}") from exc
        raise


def fingerprint_settings(cfg: FitConfig) -> dict[str, Any]:
    """The settings that define a run's numbers, for its fingerprint: ``asdict(cfg)`` without
    :data:`RESULT_NEUTRAL`, with ``compile`` only when it is ``"inductor"`` or ``"cudagraphs"`` (``"capture"`` computes
    the numbers of ``"off"``) and ``tf32`` only when on (so checkpoints written before these settings
    existed still resume)."""
    settings = asdict(cfg)
    for key in RESULT_NEUTRAL:
        settings.pop(key, None)
    if settings.get("shards") == 1:  # one shard is the run of before shards existed
        settings.pop("shards", None)
    if settings.get("compile") not in ("inductor", "cudagraphs"):
        settings.pop("compile", None)
    if not settings.get("tf32"):
        settings.pop("tf32", None)
    if settings.get("threads") is None:  # torch's own count: as runs before the setting existed
        settings.pop("threads", None)
    if settings.get("batch_group") is None:  # rows shuffled one by one: as runs before the setting existed
        settings.pop("batch_group", None)
    return settings


def _fit_locked(
    model: nn.Module,
    guide: Any,
    x_all: Tensor,
    y_all: Tensor,
    cfg: FitConfig,
    dev: torch.device,
    ranks: Ranks,
    path: Path | None,
    checkpoint_every: int | None,
    resume: bool,
    allow_changes: Sequence[str],
    until_step: int | None,
    progress: bool,
    spec: dict[str, Any] | None,
    run_settings: dict[str, Any] | None,
    callbacks: Sequence[Callable[..., None]],
) -> FitResult:
    """The body of :func:`fit`, with inputs checked and the checkpoint locked: build the run (or restore it from
    the checkpoint), then :func:`_run_steps`."""
    # every rank reads the checkpoint (fails before any compute, on all ranks together)
    state = ranks.together(lambda: load_checkpoint(path) if resume else None)  # type: ignore[arg-type]
    n = x_all.shape[0]
    pyro.set_rng_seed(cfg.seed)
    model.to(dev)
    batches = Batches(n, cfg.batch_size, cfg.seed, dev, cfg.batch_group)
    _check_shards(cfg, batches.batch, ranks)
    streams = ShardStreams(cfg.shards, cfg.seed, dev) if cfg.shards > 1 else None
    example = _set_up_on_first_batch(model, guide, x_all, y_all, batches, dev, ranks)
    settings = {**fingerprint_settings(cfg), **({"run_settings": run_settings} if run_settings else {})}
    # what defines the run, for its checkpoints (hashing the data is skipped when nothing is saved)
    fingerprint = run_fingerprint(model, guide, settings, x_all, y_all, spec) if path is not None else {}
    x_all, y_all = x_all.to(dev), y_all.to(dev)

    optim = make_optimizer(param_groups(model, guide, cfg))  # groups built once; fused Adam
    run = RunState(model, guide, optim, _schedule(optim, cfg), batches, streams)
    loss_fn = _loss_for(model, cfg)
    history: dict[str, Any] = {"step": [], "elbo": [], "lr": [], "eta_lr": [], "eta": {}}
    for name in symmetry_summary(model, guide):  # a latent η: the guide's median (guide set up above)
        history["eta"][name] = []
    start, seconds = 0, 0.0
    if state is not None:
        ranks.together(lambda: _restore(state, fingerprint, run, until_step, allow_changes))
        history, start, seconds = state["history"], int(state["step"]), float(state.get("seconds", 0.0))
        _record_changes(history, state["config"], settings, allow_changes, start)

    engine = _engine(loss_fn, model, guide, ranks, dev, example)
    compile_mode = resolve_compile(cfg, model, guide, (until_step or cfg.steps) - start)
    loop = StepLoop(
        run, cfg, dev, x_all, y_all, loss_fn, callbacks, history, ranks=ranks, engine=engine, compile_mode=compile_mode
    )
    saver = _Saver(loop, path, fingerprint, spec, seconds, resumed_at=start if state is not None else None)
    seconds = _run_steps(loop, saver, start, until_step or cfg.steps, checkpoint_every, progress)
    return FitResult(model, guide, cfg, n, history, seconds, spec, loop.stats)


def _set_up_on_first_batch(
    model: nn.Module, guide: Any, x_all: Tensor, y_all: Tensor, batches: Batches, dev: torch.device, ranks: Ranks
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Build lazily-initialised guide parameters once, on the first batch (the shuffler does not advance), and move
    the guide to ``dev``; returns that batch ``(x, y, model kwargs)``, the example of :func:`_engine`."""
    n, first = x_all.shape[0], batches.perm[: batches.batch]
    x, y = x_all[first].to(dev), y_all[first].to(dev)
    ranks.together(lambda: set_up_guide(model, guide, x, y, num_data=n))
    if isinstance(guide, nn.Module):
        guide.to(dev)
    elif ranks.ddp:
        raise TypeError(
            f"strategy='ddp' needs a guide that is an nn.Module (a PyroModule or AutoGuide), got {type(guide).__name__}"
        )
    return x, y, num_data_kwargs(model, n)


def _schedule(optim: Any, cfg: FitConfig) -> Any:
    """The learning-rate schedule: cosine from the base rates to 0 over ``cfg.steps`` (paper 003), or constant."""
    if cfg.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=cfg.steps, eta_min=0.0)
    return torch.optim.lr_scheduler.LambdaLR(optim, lambda _: 1.0)


def _loss_for(model: nn.Module, cfg: FitConfig) -> Any:
    """The run's ELBO, its particles vectorised where the model declares support
    (``CatalogueModel.vectorizable_particles``, models/base.py)."""
    vectorize = cfg.num_particles > 1 and vectorizable_particles(model)
    return LEAN_ELBOS[cfg.elbo].for_model(
        model,
        num_particles=cfg.num_particles,
        vectorize_particles=vectorize,
        **({"max_plate_nesting": 1} if vectorize else {}),
    )


def _record_changes(
    history: dict[str, Any], saved: dict[str, Any], settings: dict[str, Any], allow_changes: Sequence[str], step: int
) -> None:
    """Note in the history the allowed settings a resumed run changed, with the step they changed at."""
    changed = {k: [saved.get(k), settings[k]] for k in allow_changes if saved.get(k) != settings[k]}
    if changed:
        history.setdefault("changes", []).append({"step": step, **changed})


class _Saver:
    """A run's checkpoints: the payload (everything a bit-for-bit resume needs), its writing by rank 0 after the
    state is checked, and the rescue points a diverged run can continue from (host memory; one process only: the
    check re-runs steps). ``seconds``: the run's training time so far, saved with every checkpoint."""

    def __init__(
        self,
        loop: StepLoop,
        path: Path | None,
        fingerprint: dict[str, Any],
        spec: dict[str, Any] | None,
        seconds: float,
        resumed_at: int | None,
    ) -> None:
        self.loop, self.path, self.fingerprint, self.spec, self.seconds = loop, path, fingerprint, spec, seconds
        self.points = RescuePoints(enabled=path is not None and not loop.ranks.ddp)
        self.points.written = resumed_at

    def _shard_rng(self) -> Any:
        """The shards' random streams, gathered from the ranks owning them (None without shards)."""
        return self.loop.streams.state(self.loop.ranks) if self.loop.streams is not None else None

    def payload(self, step: int, shard_rng: Any) -> dict[str, Any]:
        loop = self.loop
        return {
            "step": step,
            **loop.run.saved(),
            "config": asdict(loop.cfg),
            "fingerprint": self.fingerprint,
            "history": loop.history,
            "seconds": self.seconds,
            "spec": self.spec,
            **({"shard_rng": shard_rng} if shard_rng is not None else {}),
            "processes": loop.ranks.world,
        }

    def add_start(self, step: int) -> None:
        """The start of this call as a rescue point: the one of a run that is doomed from its first steps."""
        if self.points.enabled:
            self.points.add(self.payload(step, self._shard_rng()))

    def checkpoint(self, step: int) -> None:
        """Check the state (a non-finite one raises :class:`Diverged`) and write the checkpoint of ``step``."""
        loop = self.loop
        loop.flush()  # the history up to ``step``, its losses checked
        bad = first_invalid_state(loop.model, loop.guide, loop.optim)
        if bad is not None:
            raise Diverged(f"after step {step}: {bad}", step)
        shard_rng = self._shard_rng()

        def save() -> None:  # rank 0 writes; a failed write stops every rank
            record = self.payload(step, shard_rng)
            save_checkpoint(self.path, record)  # type: ignore[arg-type]
            self.points.add(record)

        loop.ranks.together(save if loop.ranks.is_main else lambda: None)
        self.points.written = step


def _run_steps(
    loop: StepLoop, saver: _Saver, start: int, last: int, checkpoint_every: int | None, progress: bool
) -> float:
    """Steps ``start``…``last`` − 1 with checkpoints every ``checkpoint_every`` steps, at a stop signal (then
    :class:`FitInterrupted`) and at the end; a divergence raises ``FloatingPointError`` naming its rescue point.
    Returns the run's training seconds."""
    model, guide, cfg, path = loop.model, loop.guide, loop.cfg, saver.path
    saver.add_start(start)
    loop.bar = tqdm(
        total=cfg.steps, initial=start, disable=not (progress and loop.ranks.is_main), desc="SVI", leave=False
    )
    t0 = time.perf_counter()
    try:
        with StopSignals() as stop, contextlib.closing(loop.bar):
            for step in range(start, last):
                loop.step(step, checked=cfg.validation == "always" or step == start)
                if step == start and (overflow := first_overflowed_state(loop.optim, {"model": model, "guide": guide})):
                    raise FloatingPointError(f"at step {step + 1}, the first of this call: {overflow}")  # hopeless data
                due = checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < last
                stop_now = loop.stop_requested(stop.signum, step + 1)
                if path is not None and (due or stop_now):
                    saver.seconds, t0 = saver.seconds + time.perf_counter() - t0, time.perf_counter()
                    saver.checkpoint(step + 1)
                if stop_now:
                    loop.flush()
                    raise FitInterrupted(step + 1, path, stop.signum or signal.SIGTERM)
                if loop.flush_due(progress):
                    loop.flush()
            loop.flush()
        saver.seconds += time.perf_counter() - t0
        if path is not None:
            saver.checkpoint(last)
    except Diverged as exc:
        raise FloatingPointError(_rescued(exc, loop, saver.points, path)) from exc.__cause__
    if overflow := first_overflowed_state(loop.optim, {"model": model, "guide": guide}):  # finite losses, frozen
        warn_user(f"after step {last}: {overflow}", RuntimeWarning)
    return saver.seconds


def _rescued(exc: Diverged, loop: StepLoop, points: RescuePoints, path: Path | None) -> str:
    """The message of a divergence, after finding its rescue point and writing it to ``path`` (module
    :mod:`~pyro_invariance.infer.rescue`). The model and guide are left in the state they diverged in."""
    if path is None or not points.enabled:
        return _divergence_message(exc.what, None if path is None or points.written is None else (path, points.written))
    here = Snapshot(exc.step, loop.run)
    try:
        found = search(points, rate_plans(loop.cfg), exc.step, loop.cfg.steps, loop.attempt)
    finally:
        here.restore(loop.run)
    if found.payload is not None and int(found.payload["step"]) != points.written:
        try:
            save_checkpoint(path, found.payload)
        except CheckpointError as err:
            return f"{exc.what}; writing the checked rescue point (step {found.payload['step']}) failed: {err}"
    return _rescue_message(exc.what, path, found, points.written)


def _check_shards(cfg: FitConfig, batch: int, ranks: Ranks) -> None:
    if batch % cfg.shards:
        raise ValueError(
            f"the minibatch has {batch} rows (batch_size {cfg.batch_size}, capped at the data size), not a "
            f"multiple of shards={cfg.shards}"
        )
    if cfg.shards % ranks.world:
        raise ValueError(
            f"shards={cfg.shards} is not a multiple of the {ranks.world} processes of this data-parallel "
            f"run: pass shards={ranks.world} (or a multiple of it)"
        )


def _engine(
    loss_fn: Any,
    model: nn.Module,
    guide: Any,
    ranks: Ranks,
    dev: torch.device,
    example: tuple[Tensor, Tensor, dict[str, Any]],
) -> Callable[..., Tensor]:
    """What a step calls for a shard's loss: Pyro's ``ELBOModule`` (``loss_fn(model, guide)``), inside
    ``DistributedDataParallel`` on the ranks of a process group (gradients averaged over ranks).
    DDP's ``find_unused_parameters`` (an extra graph traversal per step) is switched on only when a
    loss on ``example`` (computed aside, the random streams restored) leaves a parameter without a
    gradient. ``elbo="rws"`` is refused (one line) for a guide with a parameter that its loss cannot
    train: wake-φ differentiates log q at detached draws, so a parameter that enters only through the
    draws (AutoStructured's locations and dependencies, a MAP guide's points) gets no gradient.
    A loss with a ``check_guide`` method (one added by
    :func:`~pyro_invariance.infer.fast_step.register_elbo`) refuses a guide it cannot train there."""
    check_guide = getattr(loss_fn, "check_guide", None)
    if check_guide is not None:
        x, y, kwargs = example
        check_guide(guide, x, y, **kwargs)
    if not isinstance(guide, nn.Module):  # a plain callable guide (one process only): the ELBO itself
        return lambda *args, **kwargs: loss_fn.differentiable_loss(model, guide, *args, **kwargs)
    module = loss_fn(model, guide)
    if isinstance(loss_fn, LeanRWS_ELBO):
        untrained = ranks.together(lambda: _without_gradient(module, list(guide.named_parameters()), dev, example))
        if untrained:
            raise ValueError(
                f"elbo='rws' cannot train the guide parameters {untrained} of {type(guide).__name__}: "
                "they enter only through its reparameterised draws, which reweighted wake-sleep "
                "detaches; use another elbo ('iwae', 'meanfield'), or a guide that samples each site "
                "from its own density (mean-field, full-rank, low-rank, block-cholesky, matrix-normal)"
            )
    if not ranks.ddp:
        return module
    unused = ranks.together(lambda: bool(_without_gradient(module, list(module.named_parameters()), dev, example)))
    return torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[dev.index] if dev.type == "cuda" else None, find_unused_parameters=unused
    )


def _without_gradient(
    loss: Callable[..., Tensor],
    named: list[tuple[str, Tensor]],
    dev: torch.device,
    example: tuple[Tensor, Tensor, dict[str, Any]],
) -> list[str]:
    """The names of the trainable parameters in ``named`` that ``loss`` on ``example`` leaves without a
    gradient (computed aside: the random streams restored, no Pyro handler sees it)."""
    named = [(n, p) for n, p in named if p.requires_grad]
    x, y, kwargs = example
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), poutine.block():
        value = loss(x, y, **kwargs)
        if not value.requires_grad:
            return [n for n, _ in named]
        grads = torch.autograd.grad(value, [p for _, p in named], allow_unused=True)
    return [n for (n, _), g in zip(named, grads) if g is None]
