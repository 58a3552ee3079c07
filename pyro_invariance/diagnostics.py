"""Posterior draws of a fitted model as ArviZ data: ``to_inference_data``.

ArviZ's ``from_pyro`` needs an MCMC object, so the draws of a variational guide are converted by
hand (methods.md §5): ``num_samples`` joint draws θ_s ~ q(θ) from the guide, the model replayed
on the data with each draw, and the pointwise log-likelihood ``log p(y_n | x_n, θ_s)`` computed
from the observed site's distribution. The result feeds ``az.summary``, ``az.loo``,
``az.plot_posterior``... Keep in mind that the draws come from q, not from the posterior: PSIS-LOO
on them treats q as the posterior (its k̂ values then also flag where q is a poor fit), and
``sample_stats`` carries ``lp`` = log p(θ_s, y) and ``log_q`` = log q(θ_s) for importance
weighting (e.g. ArviZ 1.x ``loo_approximate_posterior(log_p, log_q)``); both are computed
without the plate's N/B scaling, ``log_q`` is 0 for a MAP (``Delta``) guide, and for a model with
sampled transforms (InvariantMLP) the likelihood terms are single-sample estimates.

Groups (``S = num_samples``, ``N`` rows of the chosen split; one chain)::

    posterior            every latent sample site of the model, (1, S, *site_shape)
    log_likelihood       "obs": log p(y_n | x_n, θ_s), (1, S, N), dims (chain, draw, obs_dim_0)
    posterior_predictive "obs": y_n ~ p(y | x_n, θ_s), (1, S, N, *event_shape)
    observed_data        "obs": y as the model saw it, (N, *event_shape)
    sample_stats         "lp" (log joint on this split) and "log_q" (guide log-density), (1, S)
    constant_data        "eta": symmetry parameters η / λ, dims ("generator",) with their names
    attrs                model, guide, split, num_samples, seed, eta_<generator> (floats)

Dimension names come from the model's optional ``arviz_dims()`` (site name -> list of names for
the site's own dims, e.g. ``{"out_weight": ["class", "hidden"]}``); sites it leaves out get
``<site>_dim_<i>``.
"""

from __future__ import annotations

import inspect
from typing import Any

import arviz as az
import numpy as np
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyro_invariance.data_utils import test_arrays, train_arrays
from pyro_invariance.validation import check_positive_int

__all__ = ["to_inference_data"]

SPLITS = ("train", "test")


def to_inference_data(
    result_or_pair: Any,
    data: Any,
    *,
    num_samples: int = 100,
    split: str = "train",
    seed: int = 0,
    batch_size: int = 1024,
) -> Any:
    """ArviZ data of ``num_samples`` guide draws, with the pointwise log-likelihood of ``data``.

    Args:
        result_or_pair: a :class:`~pyro_invariance.training.FitResult` or a pair ``(model, guide)``;
            ``model(x, y=None, num_data=None)`` must have one observed sample site (named
            ``"obs"`` in the catalogue's models).
        data: a dataset with ``x_train``/``y_train``/``x_test``/``y_test`` or a pair ``(x, y)``
            (used whatever ``split`` says).
        num_samples: S, the number of joint draws from the guide (a positive int).
        split: ``"train"`` or ``"test"``: which rows of a dataset to score.
        seed: seeds the draws (and the model's own randomness, e.g. sampled transforms); the
            global RNG state is restored afterwards.
        batch_size: rows per model evaluation; each draw is replayed on chunks of this size with
            the same model randomness in every chunk (the same sampled transforms ε for all N
            rows), so the result does not depend on ``batch_size``.

    Returns:
        ``arviz.InferenceData`` (ArviZ 0.x; an ``xarray.DataTree`` with the same groups on
        ArviZ 1.x) with the groups listed in the module docstring. Shapes, for S draws and N
        rows: ``posterior[site]`` ``(1, S, *site_shape)``; ``log_likelihood["obs"]`` ``(1, S, N)``;
        ``posterior_predictive["obs"]`` ``(1, S, N, *event_shape)``; ``observed_data["obs"]``
        ``(N, *event_shape)``.

    Raises:
        ValueError: ``num_samples`` or ``batch_size`` not a positive int, an unknown ``split``,
            a model without an observed site (or with several and none named ``"obs"``), or an
            ``arviz_dims()`` entry that does not match its site's shape.
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("batch_size", batch_size)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    model, guide, spec = _unpack(result_or_pair)
    x, y = (train_arrays if split == "train" else test_arrays)(data)
    device = next(iter(model.buffers()), next(iter(model.parameters()), torch.zeros(0))).device
    x, y = x.to(device), y.to(device)
    n = x.shape[0]
    chunks = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n, batch_size)]

    was_training = getattr(model, "training", None)
    if was_training is not None:
        model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_fork_devices(device)):
            torch.manual_seed(seed)
            draws = [_one_draw(model, guide, chunks, n, device, seed, s) for s in range(num_samples)]
    finally:
        if was_training is not None:
            model.train(was_training)

    obs_name = draws[0]["obs_name"]
    latent_names = list(draws[0]["latents"])
    posterior = {k: np.stack([d["latents"][k] for d in draws])[None] for k in latent_names}
    log_lik = np.stack([d["log_lik"] for d in draws])[None]  # (1, S, N)
    predictive = np.stack([d["predictive"] for d in draws])[None]  # (1, S, N, *event)
    observed = draws[0]["observed"]  # (N, *event)
    sample_stats = {
        "lp": np.array([[d["lp"] for d in draws]]),
        "log_q": np.array([[d["log_q"] for d in draws]]),
    }

    dims = _dims(model, {k: v.shape[2:] for k, v in posterior.items()}, obs_name, observed.shape)
    coords: dict[str, Any] = {}
    symmetry = {k: float(v) for k, v in getattr(model, "symmetry_parameters", lambda: {})().items()}
    constant_data = {}
    if symmetry:
        constant_data["eta"] = np.array(list(symmetry.values()))
        dims["eta"] = ["generator"]
        coords["generator"] = list(symmetry)

    attrs: dict[str, Any] = {
        "model": _registered_name(model, spec, "model"),
        "guide": _registered_name(guide, spec, "guide"),
        "guide_class": type(guide).__name__,
        "split": split,
        "num_samples": int(num_samples),
        "seed": int(seed),
        "num_data": int(n),
        "inference": "variational (draws from the guide q, not MCMC)",
    }
    attrs.update({f"eta_{k}": v for k, v in symmetry.items()})

    groups: dict[str, dict[str, np.ndarray]] = {
        "posterior": posterior,
        "log_likelihood": {obs_name: log_lik},
        "posterior_predictive": {obs_name: predictive},
        "observed_data": {obs_name: observed},
        "sample_stats": sample_stats,
    }
    if constant_data:
        groups["constant_data"] = constant_data
    return _from_dict(groups, dims=dims, coords=coords, attrs=attrs)


# ------------------------------------------------------------------------------------------------
# draws


def _unpack(result_or_pair: Any) -> tuple[Any, Any, dict[str, Any]]:
    if hasattr(result_or_pair, "model") and hasattr(result_or_pair, "guide"):
        return result_or_pair.model, result_or_pair.guide, dict(getattr(result_or_pair, "spec", None) or {})
    if isinstance(result_or_pair, (tuple, list)) and len(result_or_pair) == 2:
        return result_or_pair[0], result_or_pair[1], {}
    raise TypeError(f"expected a FitResult or a pair (model, guide), got {type(result_or_pair).__name__}")


def _one_draw(model: Any, guide: Any, chunks: list, n: int, device: torch.device, seed: int, s: int) -> dict[str, Any]:
    """One joint draw θ_s ~ q, replayed on every chunk; numpy arrays for the ArviZ groups."""
    x0, y0 = chunks[0]
    guide_trace = poutine.trace(guide).get_trace(x0, y0, num_data=n)
    log_q = sum(
        float(site["fn"].log_prob(site["value"]).sum())
        for site in guide_trace.nodes.values()
        if site["type"] == "sample" and not site_is_subsample(site) and not site["is_observed"]
    )
    replayed = poutine.replay(model, trace=guide_trace)
    rng = _rng_state(device)
    log_liks, fns, observed, latents, obs_name, lp = [], [], [], {}, None, 0.0
    for i, (xc, yc) in enumerate(chunks):
        _set_rng_state(rng, device)  # the same model randomness (sampled transforms) in every chunk
        trace = poutine.trace(replayed).get_trace(xc, yc)
        obs_name, obs_site = _observed_site(trace)
        log_liks.append(_pointwise_log_prob(obs_site, xc.shape[0]))
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
                latents[name] = site["value"].detach().cpu().numpy()
                lp += float(site["fn"].log_prob(site["value"]).sum())
    log_lik = torch.cat(log_liks)
    # Posterior predictive in a forked RNG, so that the draws above do not depend on chunking.
    with torch.random.fork_rng(devices=_fork_devices(device)):
        torch.manual_seed(seed * 1_000_003 + s + 1)
        predictive = torch.cat([fn.sample() for fn in fns])
    return {
        "obs_name": obs_name,
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


def _pointwise_log_prob(site: dict, batch: int) -> Tensor:
    """``log p(y_n | ·)`` per datum, shape ``(batch,)``.

    The observed site's ``fn.log_prob(value)`` -- unscaled, i.e. without the plate's N/B factor --
    is already summed over event dims; batch dims to the right of the data plate's dim (plates
    nested inside it, or an undeclared event dim) are summed too. The data dim is that of the
    plate named ``"data"``, else of the one vectorised plate of size ``batch``, else the leftmost.
    """
    lp = site["fn"].log_prob(site["value"])
    frames = [f for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None]
    by_name = [f for f in frames if f.name == "data"]
    by_size = [f for f in frames if f.size == batch]
    if by_name or len(by_size) == 1:
        data_dim = (by_name or by_size)[0].dim
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
    return lp


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


def _dims(model: Any, shapes: dict[str, tuple], obs_name: str, observed_shape: tuple) -> dict[str, list[str]]:
    """Dims per variable (sample dims chain/draw excluded) from ``model.arviz_dims()`` or generic."""
    given = dict(model.arviz_dims()) if callable(getattr(model, "arviz_dims", None)) else {}
    dims: dict[str, list[str]] = {}
    all_shapes = {**shapes, obs_name: tuple(observed_shape)}
    for name, shape in all_shapes.items():
        names = list(given.get(name, [f"{name}_dim_{i}" for i in range(len(shape))]))
        if len(names) != len(shape):
            raise ValueError(
                f"{type(model).__name__}.arviz_dims() gives {len(names)} dims {names} for site {name!r}, "
                f"whose value has shape {tuple(shape)}"
            )
        if names:
            dims[name] = names
    return dims


def _registered_name(obj: Any, spec: dict[str, Any], kind: str) -> str:
    """The catalogue name of a model/guide: from the run's spec, else the registry entry whose
    factory is the object's class or is annotated to return it (unique match), else the class name."""
    if isinstance(spec.get(kind), str):
        return spec[kind]
    from pyro_invariance.registry import GUIDES, MODELS

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


# ------------------------------------------------------------------------------------------------
# ArviZ 0.x / 1.x


def _arviz_is_legacy() -> bool:
    """ArviZ 0.x: ``from_dict(posterior=..., log_likelihood=..., ...)`` (one keyword per group).
    ArviZ 1.x: ``from_dict(data)`` with ``data = {group: {var: array}}``."""
    return "posterior_predictive" in inspect.signature(az.from_dict).parameters


def _from_dict(groups: dict[str, dict[str, np.ndarray]], *, dims: dict, coords: dict, attrs: dict) -> Any:
    if _arviz_is_legacy():
        # Tested with ArviZ 0.23 (Python 3.11). 0.x puts `attrs` on the InferenceData and the
        # data groups; `posterior_attrs` puts them on the posterior too.
        return az.from_dict(**groups, dims=dims, coords=coords, attrs=attrs, posterior_attrs=dict(attrs))
    # ArviZ 1.x (arviz_base.from_dict -> xarray.DataTree; attrs keyed by group, "/" = root).
    # Written against the arviz-base signature but NOT tested here (ArviZ 1.x needs Python >= 3.12).
    return az.from_dict(groups, dims=dims, coords=coords, attrs={"/": attrs, "posterior": dict(attrs)})
