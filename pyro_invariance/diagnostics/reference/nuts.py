"""Running NUTS on a reference entry and checking its draws (R-hat, ESS).

:func:`run_nuts` samples the entry's latent sites with Pyro's NUTS, chains one after another;
:func:`diagnose` computes the diagnostics of Vehtari et al. (2021) as ArviZ does, and a stored
reference must pass them (:func:`passes`): rank-normalised split R-hat < :data:`RHAT_MAX` (1.01) and
bulk ESS > :data:`ESS_BULK_MIN` (400) for every scalar.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide.initialization import init_to_uniform
from torch import Tensor

from pyro_invariance._optional import arviz as az  # slow to import: at the first diagnostics or write
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.diagnostics.reference.entries import (
    NUTSSettings,
    ReferenceEntry,
    entry,
)
from pyro_invariance.diagnostics.reference.store import (
    FORMAT_VERSION,
    Reference,
    data_fingerprint,
)

__all__ = ["ESS_BULK_MIN", "RHAT_MAX", "diagnose", "passes", "run_nuts"]

#: Every scalar of a stored reference has rank-normalised split R-hat below this ...
RHAT_MAX = 1.01
#: ... and bulk effective sample size above this.
ESS_BULK_MIN = 400.0


def diagnose(draws: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """R-hat (rank-normalised split), bulk and tail ESS per scalar, with ArviZ.

    Each scalar's ``(chain, draw)`` array goes to ``az.rhat`` / ``az.ess`` on its own (a 2-D array
    means ``(chain, draw)`` in ArviZ 0.x and 1.x alike; tail ESS with ``prob=(0.05, 0.95)``, the
    0.x default, which 1.x needs spelled out — values checked equal on ArviZ 0.23.4 and 1.3.0).

    Returns:
        ``{"rhat_max", "ess_bulk_min", "ess_tail_min", "sites": {site: {...same...}}, "per_scalar":
        {site: {"rhat": [...], "ess_bulk": [...], "ess_tail": [...]}}}``.
    """
    out: dict[str, Any] = {"sites": {}, "per_scalar": {}}
    for site, value in draws.items():
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim < 2 or arr.shape[0] < 2 or arr.shape[1] < 4:
            raise ValueError(f"site {site!r}: need draws of shape (chain >= 2, draw >= 4, ...), got {arr.shape}")
        flat = arr.reshape(arr.shape[0], arr.shape[1], -1)
        rhat, bulk, tail = [], [], []
        for j in range(flat.shape[2]):
            a = flat[:, :, j]
            rhat.append(float(az.rhat(a)))
            bulk.append(float(az.ess(a, method="bulk")))
            tail.append(float(az.ess(a, method="tail", prob=(0.05, 0.95))))  # 1.x needs prob; 0.x's default
        out["per_scalar"][site] = {"rhat": rhat, "ess_bulk": bulk, "ess_tail": tail}
        out["sites"][site] = {"rhat_max": max(rhat), "ess_bulk_min": min(bulk), "ess_tail_min": min(tail)}
    sites = out["sites"].values()
    out["rhat_max"] = max(s["rhat_max"] for s in sites)
    out["ess_bulk_min"] = min(s["ess_bulk_min"] for s in sites)
    out["ess_tail_min"] = min(s["ess_tail_min"] for s in sites)
    return out


def passes(diagnostics: Mapping[str, Any]) -> bool:
    """R-hat < :data:`RHAT_MAX` and bulk ESS > :data:`ESS_BULK_MIN` for every scalar."""
    return bool(diagnostics["rhat_max"] < RHAT_MAX and diagnostics["ess_bulk_min"] > ESS_BULK_MIN)


def _versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "arviz": az.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


@pyro_scope()
def run_nuts(
    ref: str | ReferenceEntry,
    *,
    num_chains: int | None = None,
    warmup_steps: int | None = None,
    num_samples: int | None = None,
    thin: int | None = None,
    seed: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> Reference:
    """NUTS draws of an entry's latent sites, with diagnostics and metadata.

    Keyword arguments override the entry's :class:`NUTSSettings`. Chains run sequentially (one
    ``MCMC(NUTS(model), num_chains=1)`` per chain, seed ``seed + chain``), so results do not
    depend on the number of CPUs. Draws are stored as float32.
    """
    e = entry(ref) if isinstance(ref, str) else ref
    overrides = {
        "num_chains": num_chains,
        "warmup_steps": warmup_steps,
        "num_samples": num_samples,
        "thin": thin,
        "seed": seed,
    }
    settings = dataclasses.replace(e.nuts, **{k: v for k, v in overrides.items() if v is not None})
    settings.validate()
    if settings.num_chains < 2:
        raise ValueError("R-hat needs at least 2 chains")
    model, x, y = e.build()

    chains: list[dict[str, np.ndarray]] = []
    per_chain: list[dict[str, Any]] = []
    start = time.perf_counter()
    for c in range(settings.num_chains):
        draws_c, record = _run_chain(e.name, model, x, y, settings, c, progress, log)
        chains.append(draws_c)
        per_chain.append(record)
    wall = time.perf_counter() - start

    sites = sorted(chains[0])
    draws = {k: np.stack([ch[k] for ch in chains]).astype(np.float32) for k in sites}
    metadata = _metadata(e, settings, draws, per_chain, wall, x, y)
    return Reference(e.name, draws, metadata)


def _run_chain(
    name: str,
    model: Any,
    x: Tensor,
    y: Tensor,
    settings: NUTSSettings,
    c: int,
    progress: bool,
    log: Callable[[str], None] | None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Chain ``c``: its thinned draws per site and its record (seed, seconds, divergences,
    acceptance rate, adapted step size)."""
    pyro.set_rng_seed(settings.seed + c)
    kernel = NUTS(
        model,
        target_accept_prob=settings.target_accept_prob,
        max_tree_depth=settings.max_tree_depth,
        full_mass=settings.full_mass,
        init_strategy=init_to_uniform(radius=settings.init_radius),
        jit_compile=settings.jit_compile,
        ignore_jit_warnings=True,
    )
    mcmc = MCMC(
        kernel,
        num_samples=settings.num_samples,
        warmup_steps=settings.warmup_steps,
        num_chains=1,
        disable_progbar=not progress,
    )
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # Pyro's jit_compile uses torch.jit.trace, which torch 2.14 marks deprecated; should it go,
        # run with jit_compile=False (same draws up to float rounding, 4–5× slower).
        warnings.filterwarnings("ignore", message=".*torch.jit.trace.*is deprecated", category=FutureWarning)
        mcmc.run(x, y)
    seconds = time.perf_counter() - t0
    samples = mcmc.get_samples()
    draws = {k: v.detach().cpu().numpy()[:: settings.thin] for k, v in samples.items()}
    diag = mcmc.diagnostics()
    divergences = diag.get("divergences", {})
    accept = diag.get("acceptance rate", {})
    record = {
        "seed": settings.seed + c,
        "seconds": round(seconds, 2),
        "divergences": int(sum(len(v) for v in divergences.values())) if divergences else 0,
        "acceptance_rate": float(next(iter(accept.values()))) if accept else float("nan"),
        "step_size": float(kernel.step_size),
    }
    if log:
        log(
            f"  {name}: chain {c} {seconds:.1f}s, {record['divergences']} divergences, "
            f"acceptance {record['acceptance_rate']:.2f}, step size {record['step_size']:.3g}"
        )
    return draws, record


def _metadata(
    e: ReferenceEntry,
    settings: NUTSSettings,
    draws: dict[str, np.ndarray],
    per_chain: list[dict[str, Any]],
    wall: float,
    x: Tensor,
    y: Tensor,
) -> dict[str, Any]:
    """The JSON record stored beside the draws (:mod:`.store`)."""
    diagnostics = diagnose(draws)
    return {
        "format_version": FORMAT_VERSION,
        "name": e.name,
        "entry": e.to_dict(),
        "sampler": {
            "algorithm": "NUTS (pyro.infer.NUTS), chains run sequentially",
            **dataclasses.asdict(settings),
            "init_strategy": f"init_to_uniform(radius={settings.init_radius})",
            "chain_seeds": "seed + chain (pyro.set_rng_seed before each chain)",
        },
        "seed": settings.seed,
        "sites": {k: list(v.shape[2:]) for k, v in draws.items()},
        "num_chains": settings.num_chains,
        "draws_per_chain": int(next(iter(draws.values())).shape[1]),
        "dtype": "float32",
        "diagnostics": {
            "rhat_max": diagnostics["rhat_max"],
            "ess_bulk_min": diagnostics["ess_bulk_min"],
            "ess_tail_min": diagnostics["ess_tail_min"],
            "sites": diagnostics["sites"],
            "thresholds": {"rhat_max": RHAT_MAX, "ess_bulk_min": ESS_BULK_MIN},
            "passes": passes(diagnostics),
            "method": "arviz rank-normalised split R-hat, bulk/tail ESS (Vehtari et al. 2021), per scalar",
        },
        "chains": per_chain,
        "divergences": sum(c["divergences"] for c in per_chain),
        "wall_seconds": round(wall, 2),
        "torch_threads": torch.get_num_threads(),
        "data": {
            "source": e.data,
            "kwargs": dict(e.data_kwargs),
            "num_data": int(x.shape[0]),
            "x_shape": list(x.shape),
            "fingerprint_sha256": data_fingerprint(x, y),
        },
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": f"python -m pyro_invariance.diagnostics.reference regenerate --name {e.name}",
    }
