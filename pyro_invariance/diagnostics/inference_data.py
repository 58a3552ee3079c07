"""Posterior draws of a fitted model as ArviZ data: ``to_inference_data``.

Two sources of draws, one result layout:

* **variational** -- a :class:`~pyro_invariance.infer.training.FitResult` or a pair ``(model, guide)``:
  ``num_samples`` joint draws θ_s ~ q(θ) from the guide (ArviZ's ``from_pyro`` needs an MCMC
  object, docs/methods.md §5);
* **MCMC** -- a ``pyro.infer.MCMC`` that has run (e.g. NUTS on the model, with ``model(x, y)``),
  or a pair ``(model, draws)`` with ``draws = {site: array (chain, draw, *site_shape)}``.

Each draw is replayed through the model on the data, giving the pointwise log-likelihood
``log p(y_n | x_n, θ_s)`` from the observed site's distribution and a posterior-predictive sample.
The ArviZ container is built by the torch-free :mod:`pyro_invariance.diagnostics.arviz_compat`
(``arviz.InferenceData`` on ArviZ 0.x, ``xarray.DataTree`` on 1.x), whose version-independent
:func:`~pyro_invariance.diagnostics.arviz_compat.summary`, :func:`~pyro_invariance.diagnostics.arviz_compat.loo`,
:func:`~pyro_invariance.diagnostics.arviz_compat.loo_approximate_posterior`, :func:`loo_values`,
:func:`plot_posterior` and :func:`plot_forest` are re-exported here.

Guide draws come from q, not from the posterior: plain PSIS-LOO on them treats q as the posterior
(its k̂ values then also flag where q is a poor fit); :func:`loo_approximate_posterior` corrects for
q with ``sample_stats`` ``lp`` = log p(θ_s, D) and ``log_q`` = log q(θ_s) (Magnusson et al. 2019;
``arviz.loo_approximate_posterior`` on ArviZ 1.x). Both are computed without the plate's N/B
scaling; ``log_q`` is 0 for a MAP (``Delta``) guide; for a model with sampled transforms
(InvariantMLP) the likelihood terms are single-sample estimates.

Groups (C chains, D draws, N rows of the split)::

    posterior            every latent sample site of the model, (C, D, *site_shape) -- with η
                         when it is latent (``symmetry_prior``; e.g. "eta", dims ("generator",)), and
                         with a point-estimate η as a constant when ``eta_in_posterior=True``
    log_likelihood       "obs": log p(y_n | x_n, θ), (C, D, N), dims (chain, draw, data)
    posterior_predictive "obs": y_n ~ p(y | x_n, θ), (C, D, N, *event_shape)
    observed_data        "obs": y as the model saw it, (N, *event_shape)
    sample_stats         "lp" (log joint on this split), (C, D); guides: "log_q" (guide log-density);
                         MCMC: "diverging" (bool), when the sampler reports divergences
    constant_data        "eta": symmetry parameters η / λ when they are point estimates (not draws),
                         dims ("generator",) with their names as coords; its ``hint`` attribute says
                         how to plot it or draw it
    attrs                model, guide / sampler, split, num_samples, num_chains, seed, inference,
                         draws ("independent" for a guide, "mcmc"), eta_<generator>; guides:
                         summary_hint; MCMC: num_warmup, step_size, acceptance_rate (mean over chains)

**Guide draws as chains.** The S guide draws are independent; ArviZ's R-hat and ESS (and so
``az.summary``'s default columns) need at least 2 chains of 4 draws and log a "Shape validation
failed" warning otherwise. So S draws are laid out as 2 chains of S/2 when S is even and at least 8
(``chains=`` chooses another split, e.g. ``chains=1``), and ``az.summary(idata)`` runs without
warnings; its R-hat (≈ 1) and ESS (≈ S) then hold by construction and say nothing about the fit.
``az.summary(idata, kind="stats")`` shows the statistics alone (the ``summary_hint`` attribute says
so), as the re-exported :func:`summary` does by default for guide draws.

**A point-estimate η** (type-II maximum likelihood, or fixed) is a value, not a draw: it is kept in
``constant_data`` and the ``eta_<generator>`` attributes, out of the posterior, whose every variable
then has a finite R-hat (a constant's R-hat is undefined: ``az.summary`` warns and prints NaN, which
breaks the usual ``(summary.r_hat < 1.01).all()`` check of MCMC draws). ``eta_in_posterior=True``
also puts it in the posterior as the same value in every draw (attribute ``estimate = "point"``), so
that ``az.plot_posterior(idata, var_names=["eta"])`` finds it; a model's ``symmetry_prior=`` makes η
a latent with draws. The re-exported :func:`summary`, :func:`plot_posterior` and :func:`plot_forest`
refuse ``var_names=["eta"]`` for a point η kept out of the posterior in one line that says so.

**Observation dims** are named after the data: the first dim of the observed site is the name of its
data plate (``pyro.plate("data", ...)``: ``data``), unless a catalogue model's ``arviz_dims()`` names
it otherwise than the generic ``<site>_dim_0``.

Dimension names come from a catalogue model's ``arviz_dims()``
(:class:`~pyro_invariance.models.base.CatalogueModel`; site name -> list of names for the site's own
dims, e.g. ``{"out_weight": ["class", "hidden"]}``); sites it leaves out, and every site of any other
model, get ``<site>_dim_<i>`` (the observed site's data dim excepted, above). Coordinates come from a
catalogue model's ``arviz_coords()`` (dim -> values), else a ``class`` dim is labelled with the
dataset's class names (``data.info["classes"]``) when their number matches, else ``0, 1, ...``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import test_arrays, train_arrays
from pyro_invariance.diagnostics import arviz_compat
from pyro_invariance.diagnostics.arviz_compat import (  # noqa: F401  (re-exported)
    DRAWS_ATTR,
    INDEPENDENT,
    loo,
    loo_approximate_posterior,
    loo_values,
    plot_forest,
    plot_posterior,
    summary,
)
from pyro_invariance.guides.base import check_guide_for
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.models.base import CatalogueModel, symmetry_summary
from pyro_invariance.registry import GUIDES, MODELS
from pyro_invariance.validation import check_positive_int, check_seed, num_classes_of, num_data_kwargs

__all__ = [
    "to_inference_data",
    "summary",
    "loo",
    "loo_approximate_posterior",
    "loo_values",
    "plot_posterior",
    "plot_forest",
]

SPLITS = ("train", "test")
#: ``num_samples`` of guide draws when not given.
DEFAULT_GUIDE_SAMPLES = 100
#: ArviZ's smallest sample for R-hat and ESS without its shape warning: 2 chains of 4 draws.
MIN_CHAINS, MIN_DRAWS = 2, 4
#: What a point-estimate η is and how to get it where ArviZ's plots read (the ``hint`` attribute).
ETA_HINT = (
    "η as fitted (a point estimate) or fixed, one value for every draw; to_inference_data(..., "
    "eta_in_posterior=True) also puts it in the posterior group for ArviZ's plots, and a model's "
    "symmetry_prior=... makes η a latent with draws"
)


@pyro_scope()
def to_inference_data(
    source: Any,
    data: Any,
    *,
    num_samples: int | None = None,
    split: str = "train",
    seed: int = 0,
    batch_size: int = 1024,
    chains: int | None = None,
    eta_in_posterior: bool = False,
) -> Any:
    """ArviZ data of posterior draws, with the pointwise log-likelihood of ``data``.

    Args:
        source: where the draws come from --
            a :class:`~pyro_invariance.infer.training.FitResult` or a pair ``(model, guide)`` (guide
            draws); a ``pyro.infer.MCMC`` after ``run`` (its kernel's model is used); or a pair
            ``(model, draws)`` with ``draws`` a mapping ``site -> (chain, draw, *site_shape)``
            array of every latent site. ``model(x, y=None)`` (Pyro's convention; ``num_data=`` is
            passed when the model takes it) must have one observed sample site (named ``"obs"`` in
            the catalogue's models).
        data: a dataset with ``x_train``/``y_train``/``x_test``/``y_test`` or a pair ``(x, y)``
            (used whatever ``split`` says); converted and checked once for the model, as ``fit`` and
            ``evaluate`` do (:func:`~pyro_invariance.data.arrays.train_arrays`: any real dtype, numpy
            arrays, labels checked against ``[0, num_classes)``).
        num_samples: guide draws S (default 100); for MCMC, the first ``num_samples`` draws of
            each chain (default all).
        split: ``"train"`` or ``"test"``: which rows of a dataset to score.
        seed: seeds the draws (and the model's own randomness, e.g. sampled transforms), an integer
            in ``0 … 2**32 − 1``; the global RNG state is restored afterwards.
        batch_size: rows per model evaluation; each draw is replayed on chunks of this size with
            the same model randomness in every chunk (the same sampled transforms ε for all N
            rows), so the result does not depend on ``batch_size``.
        chains: guide draws only: the S independent draws are laid out as ``chains`` chains of
            S / ``chains`` draws (S must be a multiple). Default: 2 when S is even and at least 8
            (ArviZ's minimum for R-hat and ESS, so ``az.summary`` does not warn), else 1. MCMC draws
            keep their own chains.
        eta_in_posterior: also put a point-estimate (or fixed) η in the posterior group, the same
            value in every draw, so that ArviZ's plots find it by ``var_names=["eta"]`` (its R-hat is
            then undefined: ``az.summary`` warns on that row). Default: ``constant_data`` only.

    Returns:
        ``arviz.InferenceData`` (ArviZ 0.x; an ``xarray.DataTree`` with the same groups on
        ArviZ 1.x) with the groups listed in the module docstring. Shapes, for C chains of D
        draws and N rows: ``posterior[site]`` ``(C, D, *site_shape)``; ``log_likelihood["obs"]``
        ``(C, D, N)``; ``posterior_predictive["obs"]`` ``(C, D, N, *event_shape)``;
        ``observed_data["obs"]`` ``(N, *event_shape)``.

    Raises:
        ValueError: ``num_samples``, ``batch_size`` or ``chains`` not a positive int, an unknown
            ``split``, a ``seed`` outside ``0 … 2**32 − 1``, ``eta_in_posterior`` not a bool, bad data
            (one line naming ``x`` or ``y``), a guide's ``num_samples`` not a multiple of ``chains``,
            ``chains`` given with MCMC draws, a model without an observed site (or with several and
            none named ``"obs"``), an ``arviz_dims()`` entry that does not match its site's shape,
            MCMC draws that miss a latent site or disagree in their (chain, draw) shape.
        TypeError: an unrecognised ``source``.
    """
    if num_samples is not None:
        check_positive_int("num_samples", num_samples)
    check_positive_int("batch_size", batch_size)
    if chains is not None:
        check_positive_int("chains", chains)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(eta_in_posterior, bool):
        raise ValueError(f"eta_in_posterior must be True or False, got {eta_in_posterior!r}")
    seed = check_seed(seed)
    src = _source(source, num_samples, chains)
    model = src.model
    # the data boundary of fit / evaluate: the model's dtype, labels range-checked, shapes checked
    x, y = (train_arrays if split == "train" else test_arrays)(data, model)
    device = _device(model)
    x, y = x.to(device), y.to(device)
    n = x.shape[0]
    chunks = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]

    with eval_mode(model), torch.no_grad(), torch.random.fork_rng(devices=_fork_devices(device)):
        torch.manual_seed(seed)
        draws = [
            _one_draw(model, trace, log_q, chunks, device, seed, s, strict=src.kind == "mcmc")
            for s, (trace, log_q) in enumerate(src.traces(chunks[0], n, device))
        ]
    groups, dims = _groups(src, draws)
    coords = _coords(model, data, dims)
    symmetry = {k: float(v) for k, v in symmetry_summary(model).items()}
    var_attrs = _add_point_symmetry(groups, dims, coords, symmetry, src.shape, eta_in_posterior)
    attrs: dict[str, Any] = {
        "model": _registered_name(model, src.spec, "model"),
        **src.attrs,
        "split": split,
        "num_samples": int(src.shape[0] * src.shape[1]),
        "num_chains": int(src.shape[0]),
        "seed": int(seed),
        "num_data": int(n),
    }
    attrs.update({f"eta_{k}": v for k, v in symmetry.items()})
    return arviz_compat.from_arrays(groups, dims=dims, coords=coords, attrs=attrs, var_attrs=var_attrs)


def _groups(src: _Source, draws: list[dict[str, Any]]) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[str]]]:
    """The sampled and observed groups of the draws, and every variable's dims."""
    chains, per_chain = src.shape
    obs_name = draws[0]["obs_name"]

    def stack(key: str, name: str | None = None) -> np.ndarray:
        values = [d[key] if name is None else d[key][name] for d in draws]
        arr = np.stack([np.asarray(v) for v in values])
        return arr.reshape(chains, per_chain, *arr.shape[1:])

    posterior = {k: stack("latents", k) for k in draws[0]["latents"]}
    observed = draws[0]["observed"]  # (N, *event)
    sample_stats = {"lp": stack("lp")}
    if src.kind == "guide":
        sample_stats["log_q"] = stack("log_q")
    sample_stats.update(src.sample_stats)
    shapes = {k: v.shape[2:] for k, v in posterior.items()}
    dims = _dims(src.model, shapes, obs_name, observed.shape, draws[0]["data_plate"])
    groups = {
        "posterior": posterior,
        "log_likelihood": {obs_name: stack("log_lik")},  # (C, D, N)
        "posterior_predictive": {obs_name: stack("predictive")},  # (C, D, N, *event)
        "observed_data": {obs_name: observed},
        "sample_stats": sample_stats,
    }
    return groups, dims


def _add_point_symmetry(
    groups: dict[str, dict[str, np.ndarray]],
    dims: dict[str, list[str]],
    coords: dict[str, list[Any]],
    symmetry: dict[str, float],
    shape: tuple[int, int],
    in_posterior: bool,
) -> dict[str, dict[str, dict[str, str]]]:
    """A point-estimate η (``symmetry`` non-empty) into ``constant_data`` -- and, asked, into the posterior
    as the same value in every draw -- in place; returns the variables' attributes."""
    if not symmetry:
        return {}
    values = np.array(list(symmetry.values()))
    groups["constant_data"] = {"eta": values}
    dims["eta"] = ["generator"]
    coords["generator"] = list(symmetry)
    var_attrs = {"constant_data": {"eta": {"estimate": "point", "hint": ETA_HINT}}}
    if in_posterior and "eta" not in groups["posterior"]:
        groups["posterior"]["eta"] = np.broadcast_to(values, (*shape, values.size)).copy()
        var_attrs["posterior"] = {"eta": {"estimate": "point", "hint": ETA_HINT}}
    return var_attrs


# ------------------------------------------------------------------------------------------------
# sources of draws


@dataclass
class _Source:
    """Draws of one kind. ``traces(first_chunk, n, device)`` yields, per draw in chain-major order,
    a trace of latent values to replay and log q (guides) or None; ``shape`` = (chains, draws)."""

    kind: str  # "guide" or "mcmc"
    model: Any
    shape: tuple[int, int]
    traces: Callable[[tuple[Tensor, Tensor], int, torch.device], Iterator[tuple[Trace, float | None]]]
    attrs: dict[str, Any]
    spec: dict[str, Any] = field(default_factory=dict)
    sample_stats: dict[str, np.ndarray] = field(default_factory=dict)


def _source(source: Any, num_samples: int | None, chains: int | None) -> _Source:
    if chains is not None and (_is_mcmc(source) or _is_draws_pair(source)):
        raise ValueError(f"chains={chains} lays out guide draws; MCMC draws keep their own chains: leave chains unset")
    if _is_mcmc(source):
        model = getattr(source.kernel, "model", None)
        if model is None:
            raise ValueError("the MCMC kernel has no model (a potential_fn kernel): pass (model, draws) instead")
        draws = _check_draws(source.get_samples(group_by_chain=True), num_samples)
        shape = next(iter(draws.values())).shape[:2]
        sampler = type(source.kernel).__name__
        stats, extra = _mcmc_stats(source, shape)
        attrs = {"sampler": sampler, "inference": f"MCMC ({sampler})", DRAWS_ATTR: "mcmc", **extra}
        return _Source("mcmc", model, shape, _replay_draws(draws), attrs, sample_stats=stats)
    if _is_draws_pair(source):
        draws = _check_draws(source[1], num_samples)
        shape = next(iter(draws.values())).shape[:2]
        attrs = {"inference": "MCMC (draws given as arrays)", DRAWS_ATTR: "mcmc"}
        return _Source("mcmc", source[0], shape, _replay_draws(draws), attrs)
    model, guide, spec = _unpack(source)
    check_guide_for(model, guide)
    s = DEFAULT_GUIDE_SAMPLES if num_samples is None else num_samples
    shape = _guide_layout(s, chains)

    def guide_traces(first: tuple[Tensor, Tensor], n: int, device: torch.device) -> Iterator[tuple[Trace, float]]:
        for _ in range(s):
            trace = poutine.trace(guide).get_trace(first[0], first[1], **num_data_kwargs(model, n))
            log_q = sum(
                float(site["fn"].log_prob(site["value"]).sum())
                for site in trace.nodes.values()
                if site["type"] == "sample" and not site_is_subsample(site) and not site["is_observed"]
            )
            yield trace, log_q

    attrs = {
        "guide": _registered_name(guide, spec, "guide"),
        "guide_class": type(guide).__name__,
        "inference": "variational (draws from the guide q, not MCMC)",
        DRAWS_ATTR: INDEPENDENT,
        "summary_hint": (
            f"{s} independent draws from the guide q, laid out as {_chains_text(*shape)}: their R-hat and ESS "
            'hold by construction and do not check the fit; az.summary(idata, kind="stats") shows the statistics '
            "alone"
        ),
    }
    return _Source("guide", model, shape, guide_traces, attrs, spec=spec)


def _guide_layout(num_draws: int, chains: int | None) -> tuple[int, int]:
    """``(chains, draws per chain)`` of ``num_draws`` independent guide draws (any split is as good as
    another); default: 2 chains when each gets ArviZ's minimum of 4 draws, else 1."""
    if chains is None:
        even = num_draws % MIN_CHAINS == 0 and num_draws >= MIN_CHAINS * MIN_DRAWS
        chains = MIN_CHAINS if even else 1
    elif num_draws % chains:
        raise ValueError(
            f"num_samples={num_draws} is not a multiple of chains={chains}: the guide's independent draws are "
            "laid out as chains of equal length"
        )
    return chains, num_draws // chains


def _chains_text(chains: int, per_chain: int) -> str:
    return f"{chains} chain{'s' if chains > 1 else ''} of {per_chain}"


def _is_draws_pair(source: Any) -> bool:
    return isinstance(source, (tuple, list)) and len(source) == 2 and isinstance(source[1], Mapping)


def _replay_draws(draws: dict[str, Tensor]) -> Callable[..., Iterator[tuple[Trace, None]]]:
    """Traces holding one MCMC draw's latent values each (for ``poutine.replay``)."""

    def traces(first: tuple[Tensor, Tensor], n: int, device: torch.device) -> Iterator[tuple[Trace, None]]:
        chains, per_chain = next(iter(draws.values())).shape[:2]
        for c in range(chains):
            for d in range(per_chain):
                trace = Trace()
                for name, value in draws.items():
                    trace.add_node(name, type="sample", is_observed=False, value=value[c, d].to(device), infer={})
                yield trace, None

    return traces


def _is_mcmc(obj: Any) -> bool:
    return hasattr(obj, "kernel") and callable(getattr(obj, "get_samples", None)) and hasattr(obj, "num_chains")


def _check_draws(draws: Mapping[str, Any], num_samples: int | None) -> dict[str, Tensor]:
    if not draws:
        raise ValueError("no MCMC draws: the draws mapping is empty (has the MCMC run?)")
    out = {k: torch.as_tensor(v) for k, v in draws.items()}
    shapes = {k: tuple(v.shape[:2]) for k, v in out.items()}
    if any(v.dim() < 2 for v in out.values()) or len(set(shapes.values())) != 1:
        raise ValueError(f"MCMC draws must all start with the same (chain, draw) dims, got {shapes}")
    available = next(iter(shapes.values()))[1]
    if num_samples is not None:
        if num_samples > available:
            raise ValueError(f"num_samples={num_samples} but the MCMC has {available} draws per chain")
        out = {k: v[:, :num_samples] for k, v in out.items()}
    return out


def _mcmc_stats(mcmc: Any, shape: tuple[int, int]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``diverging`` per draw and per-run attrs from what Pyro's MCMC keeps (it keeps no per-draw
    acceptance probabilities or step sizes: only divergent draw indices and acceptance rates)."""
    chains, per_chain = shape
    stats: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {"num_chains": int(chains), "num_warmup": int(getattr(mcmc, "warmup_steps", 0) or 0)}
    try:
        diag = mcmc.diagnostics()
    except Exception:  # noqa: BLE001  (a sampler without diagnostics)
        diag = {}
    if "divergences" in diag:
        diverging = np.zeros((chains, per_chain), dtype=bool)
        for c, key in enumerate(sorted(diag["divergences"])[:chains]):
            idx = [i for i in diag["divergences"][key] if 0 <= i < per_chain]
            diverging[c, idx] = True
        stats["diverging"] = diverging
    if "acceptance rate" in diag:
        attrs["acceptance_rate"] = float(np.mean([float(v) for v in diag["acceptance rate"].values()]))
    step_size = getattr(mcmc.kernel, "step_size", None)
    if step_size is not None:
        attrs["step_size"] = float(step_size)
    return stats, attrs


def _unpack(result_or_pair: Any) -> tuple[Any, Any, dict[str, Any]]:
    if hasattr(result_or_pair, "model") and hasattr(result_or_pair, "guide"):
        return result_or_pair.model, result_or_pair.guide, dict(getattr(result_or_pair, "spec", None) or {})
    if isinstance(result_or_pair, (tuple, list)) and len(result_or_pair) == 2:
        return result_or_pair[0], result_or_pair[1], {}
    raise TypeError(
        "expected a FitResult, a pair (model, guide), a pyro.infer.MCMC or a pair (model, draws), "
        f"got {type(result_or_pair).__name__}"
    )


# ------------------------------------------------------------------------------------------------
# one draw


def _one_draw(
    model: Any,
    latent_trace: Trace,
    log_q: float | None,
    chunks: list,
    device: torch.device,
    seed: int,
    s: int,
    *,
    strict: bool,
) -> dict[str, Any]:
    """One joint draw θ_s (a trace of latent values), replayed on every chunk; numpy arrays.
    ``strict``: every latent site of the model must have a value in ``latent_trace`` (MCMC)."""
    replayed = poutine.replay(model, trace=latent_trace)
    rng = _rng_state(device)
    log_liks, fns, observed, latents, obs_name, lp, plate = [], [], [], {}, None, 0.0, None
    for i, (xc, yc) in enumerate(chunks):
        _set_rng_state(rng, device)  # the same model randomness (sampled transforms) in every chunk
        trace = poutine.trace(replayed).get_trace(xc, yc)
        obs_name, obs_site = _observed_site(trace)
        log_lik, plate = _pointwise_log_prob(obs_site, xc.shape[0])
        log_liks.append(log_lik)
        fns.append(obs_site["fn"])
        observed.append(obs_site["value"])
        if i == 0:
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
                    continue
                if any(f.name == "data" for f in site["cond_indep_stack"]):
                    raise ValueError(
                        f"latent site {name!r} lies in the data plate (a local latent); "
                        "to_inference_data supports global latents only"
                    )
                if strict and name not in latent_trace.nodes:
                    raise ValueError(f"the MCMC draws have no values for the model's latent site {name!r}")
                latents[name] = site["value"].detach().cpu().numpy()
                lp += float(site["fn"].log_prob(site["value"]).sum())
    log_lik = torch.cat(log_liks)
    # Posterior predictive in a forked RNG, so that the draws above do not depend on chunking.
    with torch.random.fork_rng(devices=_fork_devices(device)):
        torch.manual_seed(seed * 1_000_003 + s + 1)
        predictive = torch.cat([fn.sample() for fn in fns])
    return {
        "obs_name": obs_name,
        "data_plate": plate,
        "latents": latents,
        "log_lik": log_lik.detach().to(torch.float64).cpu().numpy(),
        "predictive": predictive.detach().cpu().numpy(),
        "observed": torch.cat(observed).detach().cpu().numpy(),
        "lp": lp + float(log_lik.to(torch.float64).sum()),
        "log_q": log_q,
    }


def _observed_site(trace: Any) -> tuple[str, dict]:
    observed = {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and site["is_observed"] and not site_is_subsample(site)
    }
    if not observed:
        raise ValueError(
            "model has no observed site: to_inference_data needs a pyro.sample(..., obs=y) site "
            "(named 'obs' in the catalogue's models) to compute the pointwise log-likelihood"
        )
    if "obs" in observed:
        return "obs", observed["obs"]
    if len(observed) > 1:
        raise ValueError(f"model has several observed sites {sorted(observed)} and none is named 'obs'")
    return next(iter(observed.items()))


def _pointwise_log_prob(site: dict, batch: int) -> tuple[Tensor, str | None]:
    """``log p(y_n | ·)`` per datum, shape ``(batch,)``, and the name of the data plate (``None``
    when the data dim is found without one).

    The observed site's ``fn.log_prob(value)`` -- unscaled, i.e. without the plate's N/B factor --
    is already summed over event dims; batch dims to the right of the data plate's dim (plates
    nested inside it, or an undeclared event dim) are summed too. The data dim is that of the
    plate named ``"data"``, else of the one vectorised plate of size ``batch``, else the leftmost.
    """
    lp = site["fn"].log_prob(site["value"])
    frames = [f for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None]
    by_name = [f for f in frames if f.name == "data"]
    by_size = [f for f in frames if f.size == batch]
    plate = None
    if by_name or len(by_size) == 1:
        data_dim, plate = (by_name or by_size)[0].dim, (by_name or by_size)[0].name
    elif lp.dim() >= 1 and lp.shape[0] == batch:
        data_dim = -lp.dim()
    else:
        raise ValueError(
            f"cannot find the data dimension of the observed site (log_prob shape {tuple(lp.shape)}, "
            f"{batch} rows): put it in pyro.plate('data', ...)"
        )
    if lp.dim() < -data_dim:
        lp = lp.reshape((1,) * (-data_dim - lp.dim()) + tuple(lp.shape))
    pos = lp.dim() + data_dim
    if any(size != 1 for size in lp.shape[:pos]):
        raise ValueError(f"observed site has batch shape {tuple(lp.shape)}: vectorised draws are not supported")
    lp = lp.reshape(lp.shape[pos:])
    if lp.dim() > 1:
        lp = lp.reshape(lp.shape[0], -1).sum(-1)
    if lp.shape != (batch,):
        raise ValueError(f"pointwise log-likelihood has shape {tuple(lp.shape)}, expected ({batch},)")
    return lp, plate


def _device(model: Any) -> torch.device:
    """The device of a module's first buffer or parameter (CPU for a plain function)."""
    if not isinstance(model, torch.nn.Module):
        return torch.device("cpu")
    return next(iter(model.buffers()), next(iter(model.parameters()), torch.zeros(0))).device


def _fork_devices(device: torch.device) -> list[int]:
    """CUDA devices whose RNG ``torch.random.fork_rng`` must save (none on CPU)."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


# ------------------------------------------------------------------------------------------------
# names


def _dims(
    model: Any, shapes: dict[str, tuple], obs_name: str, observed_shape: tuple, data_plate: str | None
) -> dict[str, list[str]]:
    """Dims per variable (sample dims chain/draw excluded) from ``model.arviz_dims()`` or generic; the
    observed site's data dim is named after its plate (``data_plate``) unless given another name."""
    given = dict(model.arviz_dims()) if isinstance(model, CatalogueModel) else {}
    dims: dict[str, list[str]] = {}
    all_shapes = {**shapes, obs_name: tuple(observed_shape)}
    for name, shape in all_shapes.items():
        names = list(given.get(name, [f"{name}_dim_{i}" for i in range(len(shape))]))
        if len(names) != len(shape):
            raise ValueError(
                f"{type(model).__name__}.arviz_dims() gives {len(names)} dims {names} for site {name!r}, "
                f"whose value has shape {tuple(shape)}"
            )
        if name == obs_name and names and names[0] == f"{obs_name}_dim_0":
            # a plate named like the site or like another of its dims would clash in xarray
            if data_plate and data_plate != obs_name and data_plate not in names:
                names[0] = data_plate
        if names:
            dims[name] = names
    return dims


def _registered_name(obj: Any, spec: dict[str, Any], kind: str) -> str:
    """The catalogue name of a model/guide: from the run's spec, else the registry entry whose
    factory is the object's class or is annotated to return it (unique match), else the class name."""
    if isinstance(spec.get(kind), str):
        return spec[kind]
    if isinstance(getattr(obj, "catalogue_name", None), str):  # one class behind several entries
        return obj.catalogue_name
    cls = type(obj)
    matches = []
    for entry in (MODELS if kind == "model" else GUIDES).items():
        if entry.factory is cls:
            return entry.name
        try:
            returns = inspect.signature(entry.factory).return_annotation
        except (TypeError, ValueError):
            continue
        if returns is cls or returns == cls.__name__:
            matches.append(entry.name)
    return matches[0] if len(matches) == 1 else cls.__name__


def _coords(model: Any, data: Any, dims: dict[str, list[str]]) -> dict[str, list[Any]]:
    """Coordinates: ``model.arviz_coords()`` of a catalogue model; a ``class`` dim gets the dataset's
    class names when their number matches the site's size (checked by ``from_arrays``)."""
    coords: dict[str, list[Any]] = {}
    if isinstance(model, CatalogueModel):
        coords.update({k: list(v) for k, v in model.arviz_coords().items()})
    classes = getattr(data, "info", {}).get("classes") if isinstance(getattr(data, "info", None), dict) else None
    num_classes = num_classes_of(model)
    if (
        "class" not in coords
        and classes is not None
        and num_classes == len(classes)
        and any("class" in names for names in dims.values())
    ):
        coords["class"] = [str(c) for c in classes]
    return coords
