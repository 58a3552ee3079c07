"""Metrics, symmetry analysis and plots for Hamiltonian models (talk 000 tables; docs/methods.md §4).

:func:`evaluate_hnn` returns the columns of the talk's tables:

* ``train_mse``: mean squared error of the posterior-predictive mean on the training pairs,
* ``nll``: E_q[−log p(y | x, θ)] / N on the training data,
* ``kl``: KL(q ‖ p) / N (analytic where registered, else a one-sample estimate),
* ``neg_elbo``: ``nll + kl`` (−ELBO / N, lower is better),
* ``test_mse``, ``wider_mse``, ``moved_mse``: predictive-mean MSE on the other splits,
* ``energy_drift``: median over rollouts of the mean relative change of the *true* energy,
  ``|H(x̂_t) − H(x_0)| / |H(x_0)|`` (absolute for ``|H(x_0)| < 1e-6``), along rollouts of the learned
  model from the test initial states (the median: a few diverging rollouts should not dominate).

MSEs are averaged over state coordinates and pairs (the talk's convention of a per-element MSE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from pyro import poutine
from torch import Tensor
from torch.distributions import kl_divergence

from pyro_invariance._optional import pyplot as plt
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import prepare_arrays, test_arrays, train_arrays
from pyro_invariance.data.physics import PhysicsDataset
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.symmetry.conserved import SymmetryAnalysis, analyse_generators, oracle_generators
from pyro_invariance.tasks import DYNAMICS, evaluation_device, seeded_rng
from pyro_invariance.validation import check_positive_int, check_seed

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_ORACLE_FOR = {"sho": "so2", "oscillators": "un", "nbody": "se2"}


def _draw(model: Any, guide: Any, x: Tensor) -> tuple[Any, Any]:
    guide_tr = poutine.trace(guide).get_trace(x[:1])
    return guide_tr, poutine.replay(model, trace=guide_tr)


@pyro_scope()
@torch.no_grad()
def rollout(model: Any, guide: Any, x0: Tensor, steps: int, num_samples: int = 4) -> Tensor:
    """Autoregressive rollouts ``(num_samples, T, steps + 1, M)``, one guide draw per rollout."""
    check_positive_int("steps", steps)
    out = []
    for _ in range(num_samples):
        _, conditioned = _draw(model, guide, x0)
        xs = [x0]
        for _ in range(steps):
            xs.append(poutine.block(conditioned)(xs[-1]))
        out.append(torch.stack(xs, dim=1))
    return torch.stack(out)


@pyro_scope()
@torch.no_grad()
def nll_kl(model: Any, guide: Any, x: Tensor, y: Tensor, num_particles: int = 4) -> tuple[float, float]:
    """``(E_q[−log p(y|x,θ)]/N, KL(q‖p)/N)`` on the full data, averaged over particles."""
    n = x.shape[0]
    nll = kl = 0.0
    for _ in range(num_particles):
        guide_tr, _ = _draw(model, guide, x)
        model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(x, y, num_data=n)
        for name, site in model_tr.nodes.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                nll -= float(site["fn"].log_prob(site["value"]).sum())
            elif name in guide_tr.nodes:
                q = guide_tr.nodes[name]["fn"]
                try:
                    kl += float(kl_divergence(q, site["fn"]).sum())
                except NotImplementedError:
                    v = site["value"]
                    kl += float((q.log_prob(v) - site["fn"].log_prob(v)).sum())
    return nll / (n * num_particles), kl / (n * num_particles)


def energy_drift(system: Any, traj: Tensor) -> float:
    """Median over rollouts of the mean relative drift of the true energy along ``traj (..., steps+1, M)``."""
    h = system.energy(traj.detach().cpu().double())
    h0 = h[..., :1]
    denom = torch.where(h0.abs() < 1e-6, torch.ones_like(h0), h0.abs())
    per_rollout = ((h - h0).abs() / denom).mean(-1)
    per_rollout = torch.where(torch.isfinite(per_rollout), per_rollout, torch.full_like(per_rollout, float("inf")))
    return float(per_rollout.flatten().median())


@pyro_scope()
def evaluate_hnn(
    model: Any,
    guide: Any,
    data: Any,
    *,
    num_samples: int = 8,
    num_particles: int = 4,
    rollout_steps: int | None = None,
    max_test: int | None = None,
    device: Any = None,
    seed: int = 0,
) -> dict[str, float]:
    """The talk's table columns for a fitted dynamics model (the :data:`~pyro_invariance.tasks.DYNAMICS` task).

    Args:
        data: a :class:`~pyro_invariance.data.physics.PhysicsDataset` (every column: the training split,
            the held-out splits ``test`` / ``wider`` / ``moved`` and the energy drift of rollouts from
            the test trajectories), another dataset object (``x_train``/``y_train``/``x_test``/``y_test``:
            ``test_mse`` on its held-out split) or a pair ``(x, y)`` of states and next states, as
            ``fit`` takes it (every column is computed on the pair; no energy drift: it needs the system).
        num_samples: guide draws in the predictive mean.
        num_particles: draws in the NLL / KL estimates.
        rollout_steps: steps of the energy-drift rollouts (default the test split's ``steps``; 0 skips
            the energy drift).
        max_test: evaluate at most this many pairs per held-out split (speed).
        device: where to evaluate (default: the model's device).
        seed: seeds every draw (:func:`~pyro_invariance.tasks.seeded_rng`): two calls give the
            same numbers, and the caller's RNG state is left as it was.

    Every split is converted and checked once for the model
    (:func:`~pyro_invariance.data.arrays.prepare_arrays`) and moved to the device. Predictions are
    :meth:`DYNAMICS.posterior_predictive <pyro_invariance.tasks.Task.posterior_predictive>` draws.
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("num_particles", num_particles)
    if rollout_steps is not None:
        check_positive_int("rollout_steps", rollout_steps, minimum=0)
    if max_test is not None:
        check_positive_int("max_test", max_test)
    check_seed(seed)
    dev = evaluation_device(device, model)

    def split_arrays(x: Any, y: Any) -> tuple[Tensor, Tensor]:
        return tuple(t.to(dev) for t in prepare_arrays(x, y, model))  # type: ignore[return-value]

    with eval_mode(model), seeded_rng(seed, dev):
        return _hnn_columns(model, guide, data, split_arrays, num_samples, num_particles, rollout_steps, max_test)


def _mse(model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int) -> float:
    """Per-element MSE of the posterior-predictive mean next state, ``mean((E_q f(x) − y)²)``."""
    return float(((DYNAMICS.posterior_predictive(model, guide, x, num_samples).mean(0) - y) ** 2).mean())


def _hnn_columns(
    model: Any,
    guide: Any,
    data: Any,
    split_arrays: Any,
    num_samples: int,
    num_particles: int,
    rollout_steps: int | None,
    max_test: int | None,
) -> dict[str, float]:
    x, y = split_arrays(*train_arrays(data))
    out: dict[str, float] = {}
    out["train_mse"] = _mse(model, guide, x, y, num_samples)
    nll, kl = nll_kl(model, guide, x, y, num_particles)
    out.update(nll=nll, kl=kl, neg_elbo=nll + kl)
    physics = isinstance(data, PhysicsDataset)
    held_out = (
        {s: data.split(s) for s in ("test", "wider", "moved") if s in data.arrays}
        if physics
        else {"test": test_arrays(data)}
    )
    for split, (xs, ys) in held_out.items():
        if max_test is not None:
            xs, ys = xs[:max_test], ys[:max_test]
        xs, ys = split_arrays(xs, ys)
        out[f"{split}_mse"] = _mse(model, guide, xs, ys, num_samples)
    if physics and "test" in data.trajectories and rollout_steps != 0:
        traj = torch.as_tensor(data.trajectories["test"], dtype=x.dtype, device=x.device)
        x0 = traj[: (max_test or traj.shape[0]), 0]
        steps = rollout_steps or data.splits["test"].steps
        out["energy_drift"] = energy_drift(data.system, rollout(model, guide, x0, steps, num_samples=2))
    return out


def symmetry_analysis(
    model: Any, oracle: str | None = None, system: str | None = None, rel_threshold: float = 0.1
) -> SymmetryAnalysis:
    """SVD of the model's generators and parallelness to the oracle (``oracle`` name, or the
    oracle of ``system``: sho → so2, oscillators → un, nbody → se2)."""
    if oracle is None and system is not None:
        oracle = _ORACLE_FOR.get(system)
    g = model.generators().detach()
    if g.shape[0] == 0:
        raise ValueError("the model has no generators (symmetry='none')")
    o = oracle_generators(oracle, model.state_dim, torch.float64) if oracle else None
    return analyse_generators(g, o, rel_threshold)


def plot_symmetry_analysis(
    analysis: SymmetryAnalysis, *, title: str = "", target: int | None = None, fig: Figure | None = None
) -> Figure:
    """Two panels: singular values of the learned generators (bars; dashed line after the
    ``target`` count) and the parallelness ``|cos|`` of each singular vector to the oracle span (left
    blank without an oracle). Draws into ``fig`` (an empty figure; default: a new one) and returns
    it."""
    fig = fig if fig is not None else plt.figure(figsize=(8, 3))
    axes = fig.subplots(1, 2)
    s = analysis.singular_values.numpy()
    idx = range(1, len(s) + 1)
    axes[0].bar(idx, s, color="C0")
    axes[0].set(xlabel="index", ylabel="singular value", title=f"SVD ({analysis.num_significant} significant)")
    if target is not None:
        axes[0].axvline(target + 0.5, ls="--", color="k", lw=1, label=f"target {target}")
        axes[0].legend()
    if analysis.parallelness is not None:
        axes[1].bar(idx, analysis.parallelness.numpy()[: len(s)], color="C1")
        axes[1].set(xlabel="singular vector", ylabel="|cos| to oracle span", ylim=(0, 1.05), title="parallelness")
    else:
        axes[1].axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_generators(generators: Sequence[Tensor], titles: Sequence[str], *, fig: Figure | None = None) -> Figure:
    """Heat maps of generators ``(D, D)`` side by side (e.g. learned next to SO(2)), one panel and
    title each, blue < 0 < red. Draws into ``fig`` (an empty figure; default: a new one) and
    returns it."""
    fig = fig if fig is not None else plt.figure(figsize=(2.6 * len(generators), 2.6))
    axes = fig.subplots(1, len(generators), squeeze=False)[0]
    for ax, g, t in zip(axes, generators, titles):
        g = g.detach().cpu()
        lim = float(g.abs().max()) or 1.0
        ax.imshow(g.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(t)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    return fig
