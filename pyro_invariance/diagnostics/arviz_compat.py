"""One interface over both ArviZ lines, with no torch: build ArviZ data from numpy, LOO, summaries.

Python 3.11 gets ArviZ 0.23 (``arviz.InferenceData``, ``from_pyro``, plots on matplotlib);
Python >= 3.12 gets ArviZ 1.x (``xarray.DataTree``, ``from_dict(data)`` with one nested dict,
``loo_approximate_posterior``, plots returning a ``PlotCollection``; docs/methods.md §5). This module
imports only numpy, xarray and arviz (the latter two at first use, through
:mod:`pyro_invariance._optional`), so it can be tested in an environment without torch (the
``make test-arviz1`` environment on Python 3.12 loads this file and ``_optional.py`` by path). The torch side -- drawing
from guides and MCMC, the pointwise log-likelihood -- lives in :mod:`pyro_invariance.diagnostics.inference_data`,
which calls :func:`from_arrays`.

==================================  ===============================================================
function                            what
==================================  ===============================================================
:func:`from_arrays`                 ``{group: {var: ndarray}}`` -> ``InferenceData`` / ``DataTree``
:func:`group_names`,                the groups of either container, and one group as an
:func:`get_group`                   ``xarray.Dataset``
:func:`summary`                     ``az.summary`` (0.23: 94% HDI columns; 1.x: 89% ETI columns);
                                    statistics only for independent draws
:func:`independent_draws`           whether the posterior says its draws are independent (a guide's)
:func:`loo`                         ``az.loo`` (PSIS-LOO with Pareto k̂ per datum)
:func:`loo_approximate_posterior`   PSIS-LOO for draws from an approximation q of the posterior
:func:`loo_values`                  the numbers of a LOO result, the same fields on both lines
:func:`plot_posterior`,             marginal posteriors / forest plot as a matplotlib ``Figure``
:func:`plot_forest`                 (0.23: ``az.plot_posterior``; 1.x: ``az.plot_dist``)
==================================  ===============================================================

Groups without sample dims (``chain``, ``draw``) are :data:`DATA_GROUPS`; every other group's
arrays start with ``(chain, draw)``.

Independent draws (a variational guide's) are laid out as chains like MCMC draws and marked with the
attribute ``draws = "independent"`` (:data:`DRAWS_ATTR`); :func:`summary` then shows the statistics
alone, as ``az.summary(data, kind="stats")`` does, since R-hat and ESS of independent draws hold by
construction. A name asked of the posterior that only a data group holds (e.g. a point estimate kept
in ``constant_data``) is refused by :func:`summary`, :func:`plot_posterior` and :func:`plot_forest`
in one line that says where it is (with the variable's ``hint`` attribute); ArviZ's own functions
answer with a bare ``KeyError``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# ArviZ and xarray are imported at first use (importing them costs more than Pyro does)
from pyro_invariance._optional import arviz as az
from pyro_invariance._optional import xarray as xr

__all__ = [
    "DATA_GROUPS",
    "SAMPLE_DIMS",
    "LooValues",
    "arviz_version",
    "from_arrays",
    "get_group",
    "group_names",
    "independent_draws",
    "is_legacy",
    "loo",
    "loo_approximate_posterior",
    "loo_values",
    "plot_forest",
    "plot_posterior",
    "summary",
]

SAMPLE_DIMS = ("chain", "draw")
#: Groups whose arrays have no sample dims (ArviZ's convention: "data" in the group name).
DATA_GROUPS = ("observed_data", "constant_data", "predictions_constant_data")
#: The attribute that says how the draws were made: :data:`INDEPENDENT` or ``"mcmc"``.
DRAWS_ATTR = "draws"
INDEPENDENT = "independent"


def arviz_version() -> str:
    return str(az.__version__)


def is_legacy() -> bool:
    """True for ArviZ 0.x (``InferenceData``), False for 1.x (``xarray.DataTree``)."""
    try:
        return int(arviz_version().split(".")[0]) < 1
    except ValueError:  # an unparsable version: decide by the 0.x container class
        return hasattr(az, "InferenceData") and not hasattr(az, "loo_approximate_posterior")


# ------------------------------------------------------------------------------------------------
# building


def from_arrays(
    groups: Mapping[str, Mapping[str, Any]],
    *,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Sequence[Any]] | None = None,
    attrs: Mapping[str, Any] | None = None,
    group_dims: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
    var_attrs: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
) -> Any:
    """ArviZ data from plain numpy arrays, identical in content on ArviZ 0.23 and 1.x.

    Args:
        groups: ``{group: {variable: array}}``. Arrays of a sampled group (any group not in
            :data:`DATA_GROUPS`) have shape ``(chain, draw, *own_shape)``; those of a data group
            ``own_shape``.
        dims: names of each variable's own dims (sample dims excluded), shared by all groups,
            e.g. ``{"w": ["class", "hidden"]}``. In ``log_likelihood`` a variable may have fewer
            own dims than named (the event dims of the observation are summed there): the
            leading names are used. Unnamed variables get ``<var>_dim_<i>``.
        coords: values along named dims, e.g. ``{"generator": ["rot"]}``; a dim without coords
            gets ``0, 1, ...`` (``chain`` and ``draw`` too).
        attrs: attributes put on the root and on every group (JSON-friendly scalars and
            strings); ``created_at`` and ``arviz_version`` are added.
        group_dims: ``{group: {variable: dims}}`` overriding ``dims`` in one group.
        var_attrs: ``{group: {variable: {name: value}}}``: attributes of single variables (strings
            and scalars), e.g. a ``hint`` that says what a value is.

    Returns:
        ``arviz.InferenceData`` on ArviZ 0.x, ``xarray.DataTree`` on 1.x, one child per group.

    Raises:
        ValueError: an empty ``groups``, a sampled array with fewer than 2 dims, a dims entry
            whose length does not match the array, or coords of the wrong length.
    """
    if not groups:
        raise ValueError("groups is empty: give at least one {group: {variable: array}}")
    dims = dict(dims or {})
    coords = {k: list(v) for k, v in (coords or {}).items()}
    group_dims = {g: dict(v) for g, v in (group_dims or {}).items()}
    attrs = {
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "arviz_version": arviz_version(),
        **dict(attrs or {}),
    }
    var_attrs = {g: {v: dict(a) for v, a in vs.items()} for g, vs in (var_attrs or {}).items()}
    datasets = {
        name: _dataset(name, variables, {**dims, **group_dims.get(name, {})}, coords, attrs)
        for name, variables in groups.items()
    }
    for group, variables in var_attrs.items():
        for var, values in variables.items():
            if group not in datasets or var not in datasets[group]:
                raise ValueError(f"var_attrs names {group}/{var}, which is not among the groups' variables")
            datasets[group][var].attrs.update(values)
    if is_legacy():
        return az.InferenceData(attrs=dict(attrs), **datasets)
    return xr.DataTree.from_dict({"/": xr.Dataset(attrs=dict(attrs)), **datasets})


def _dataset(group: str, variables: Mapping[str, Any], dims: dict, coords: dict, attrs: dict) -> xr.Dataset:
    sampled = group not in DATA_GROUPS
    data_vars, used_coords = {}, {}
    for var, value in variables.items():
        arr = np.asarray(value)
        lead: tuple[str, ...] = SAMPLE_DIMS if sampled else ()
        if arr.ndim < len(lead):
            raise ValueError(f"{group}/{var} has shape {arr.shape}: arrays of a sampled group start with (chain, draw)")
        own = arr.ndim - len(lead)
        names = list(dims.get(var, [f"{var}_dim_{i}" for i in range(own)]))
        if group == "log_likelihood" and len(names) > own:
            names = names[:own]
        if len(names) != own:
            raise ValueError(
                f"dims for {group}/{var} are {names} ({len(names)} names) but its array has "
                f"{own} own dims (shape {arr.shape}{', after (chain, draw)' if sampled else ''})"
            )
        all_dims = (*lead, *names)
        for dim, size in zip(all_dims, arr.shape):
            values = coords.get(dim)
            if values is None:
                values = list(range(size))
            elif len(values) != size:
                raise ValueError(f"coords[{dim!r}] has {len(values)} values but {group}/{var} has {size} along it")
            if dim in used_coords and len(used_coords[dim]) != size:
                raise ValueError(f"dim {dim!r} has sizes {len(used_coords[dim])} and {size} in group {group}")
            used_coords[dim] = values
        data_vars[var] = (all_dims, arr)
    return xr.Dataset(data_vars, coords=used_coords, attrs=dict(attrs))


# ------------------------------------------------------------------------------------------------
# access


def group_names(data: Any) -> list[str]:
    """The groups of an ``InferenceData`` or ``DataTree`` (``["posterior", ...]``)."""
    if hasattr(data, "children"):  # xarray.DataTree
        return list(data.children)
    return list(data.groups())


def get_group(data: Any, name: str) -> xr.Dataset:
    """One group as an ``xarray.Dataset``."""
    if name not in group_names(data):
        raise KeyError(f"no group {name!r}; groups: {group_names(data)}")
    if hasattr(data, "children"):
        return data[name].to_dataset()
    return getattr(data, name)


# ------------------------------------------------------------------------------------------------
# statistics


def independent_draws(data: Any) -> bool:
    """True when the posterior group's ``draws`` attribute says its draws are independent (a guide's,
    laid out as chains): their R-hat and ESS hold by construction and diagnose nothing."""
    if "posterior" not in group_names(data):
        return False
    return get_group(data, "posterior").attrs.get(DRAWS_ATTR) == INDEPENDENT


def summary(data: Any, var_names: Sequence[str] | None = None, **kwargs: Any) -> Any:
    """``az.summary`` (a pandas ``DataFrame``). Both lines give ``mean``, ``sd``, ``mcse_mean``,
    ``mcse_sd``, ``ess_bulk``, ``ess_tail``, ``r_hat``; the interval columns differ (0.23:
    ``hdi_3%``/``hdi_97%``; 1.x: ``eti89_lb``/``eti89_ub``). For :func:`independent_draws` the
    default ``kind`` is ``"stats"`` (mean, sd and the interval); ``kind="all"`` asks for the rest.

    Raises:
        ValueError: a name in ``var_names`` that the posterior lacks and a data group holds.
    """
    names = list(var_names) if var_names is not None else None
    _refuse_data_names(data, names, kwargs.get("group"))
    if "kind" not in kwargs and kwargs.get("group") in (None, "posterior") and independent_draws(data):
        kwargs["kind"] = "stats"
    return az.summary(data, var_names=names, **kwargs)


def _refuse_data_names(data: Any, var_names: Sequence[str] | None, group: str | None) -> None:
    """One line for a name asked of the posterior that only a data group holds (a value, not draws):
    ArviZ itself raises a bare ``KeyError`` that does not say where the variable is."""
    if var_names is None or group not in (None, "posterior") or "posterior" not in group_names(data):
        return
    posterior = get_group(data, "posterior")
    for name in var_names:
        if name in posterior.data_vars or name.startswith("~"):
            continue
        for holder in (g for g in DATA_GROUPS if g in group_names(data)):
            dataset = get_group(data, holder)
            if name in dataset.data_vars:
                hint = dataset[name].attrs.get("hint")
                raise ValueError(
                    f"{name!r} is not in the posterior group but in {holder} (a value, not draws)"
                    + (f": {hint}" if hint else "")
                )


def loo(data: Any, *, var_name: str | None = None, pointwise: bool = True, reff: float | None = None) -> Any:
    """``az.loo``: PSIS-LOO-CV with a Pareto k̂ per datum (the native ArviZ result; read it
    with :func:`loo_values`). For draws from a variational q this treats q as the posterior;
    :func:`loo_approximate_posterior` corrects for q."""
    return az.loo(data, pointwise=pointwise, var_name=var_name, reff=reff)


def loo_approximate_posterior(
    data: Any,
    log_p: Any = None,
    log_q: Any = None,
    *,
    var_name: str | None = None,
    pointwise: bool = True,
) -> Any:
    """PSIS-LOO-CV for S draws θ_s from an approximate posterior q (Magnusson et al. 2019).

    The importance ratio of datum i is ``p(θ_s | D_{-i}) / q(θ_s) ∝ p(θ_s, D) / (q(θ_s) p(y_i | θ_s))``,
    i.e. ``log r_si = log p(θ_s, D) − log q(θ_s) − log p(y_i | θ_s)``; the ratios are Pareto
    smoothed (PSIS, r_eff = 1) and ``elpd_i = log Σ_s w_si p(y_i | θ_s)`` with normalised
    weights. When q is the exact posterior, ``log p − log q`` is constant and this is plain
    PSIS-LOO. ArviZ 1.x: ``arviz.loo_approximate_posterior`` (arviz-stats); ArviZ 0.23 has no
    such function and the same computation is done here with ``az.psislw``.

    Args:
        data: ArviZ data with a ``log_likelihood`` group of S = chain × draw draws from q.
        log_p: ``log p(θ_s, D)`` (the unnormalised target: log prior + log likelihood of the
            data the posterior conditions on), shape ``(chain, draw)`` or ``(S,)``. Default:
            ``sample_stats["lp"]``.
        log_q: ``log q(θ_s)``, same shape. Default: ``sample_stats["log_q"]``.
        var_name: the log-likelihood variable (needed when there are several).
        pointwise: keep ``elpd_i`` and ``pareto_k`` per datum.

    Returns:
        The native ELPD result (0.23: ``ELPDData`` with ``elpd_loo``, ``se``, ``p_loo``,
        ``loo_i``, ``pareto_k`` and ``approx_posterior=True``; 1.x: ``ELPDData`` with ``elpd``,
        ``se``, ``p``, ``elpd_i``, ``pareto_k``); :func:`loo_values` reads either.
    """
    ll = _log_likelihood(data, var_name)
    n_chain, n_draw = ll.sizes["chain"], ll.sizes["draw"]
    log_p = _sample_array(data, log_p, "lp", "log_p", (n_chain, n_draw))
    log_q = _sample_array(data, log_q, "log_q", "log_q", (n_chain, n_draw))
    if not is_legacy():
        coords = {"chain": ll["chain"].values, "draw": ll["draw"].values}
        return az.loo_approximate_posterior(
            data,
            xr.DataArray(log_p, dims=SAMPLE_DIMS, coords=coords),
            xr.DataArray(log_q, dims=SAMPLE_DIMS, coords=coords),
            pointwise=pointwise,
            var_name=var_name,
        )
    return _loo_approximate_posterior_legacy(ll, log_p - log_q, pointwise)


def _log_likelihood(data: Any, var_name: str | None) -> xr.DataArray:
    group = get_group(data, "log_likelihood")
    names = list(group.data_vars)
    if var_name is None:
        if len(names) != 1:
            raise ValueError(f"log_likelihood has variables {names}: pass var_name")
        var_name = names[0]
    if var_name not in names:
        raise KeyError(f"no log_likelihood variable {var_name!r}; variables: {names}")
    return group[var_name]


def _sample_array(data: Any, value: Any, stat: str, arg: str, shape: tuple[int, int]) -> np.ndarray:
    if value is None:
        if "sample_stats" not in group_names(data) or stat not in get_group(data, "sample_stats"):
            raise ValueError(f"{arg} not given and the data have no sample_stats[{stat!r}]")
        value = get_group(data, "sample_stats")[stat].values
    arr = np.asarray(getattr(value, "values", value), dtype=np.float64)
    if arr.size != shape[0] * shape[1]:
        raise ValueError(f"{arg} has shape {arr.shape}, expected (chain, draw) = {shape} or ({shape[0] * shape[1]},)")
    arr = arr.reshape(shape)
    if not np.isfinite(arr).all():
        raise ValueError(f"{arg} has non-finite values")
    return arr


def _loo_approximate_posterior_legacy(ll: xr.DataArray, log_p_minus_q: np.ndarray, pointwise: bool) -> Any:
    """ArviZ 0.23: the arithmetic of arviz-stats' ``_loo_approximate_posterior``, with ``az.psislw``."""
    obs_dims = [d for d in ll.dims if d not in SAMPLE_DIMS]
    ll = ll.transpose(*obs_dims, *SAMPLE_DIMS)
    obs_shape = ll.shape[: len(obs_dims)]
    n_samples = ll.sizes["chain"] * ll.sizes["draw"]
    lik = ll.values.reshape(-1, n_samples).astype(np.float64)  # (n_data, S)
    correction = log_p_minus_q.reshape(-1) - log_p_minus_q.max()
    log_ratios = correction - lik
    log_ratios = log_ratios - log_ratios.max(axis=1, keepdims=True)
    log_weights, pareto_k = az.psislw(log_ratios, reff=1.0)  # normalised log weights, k̂ per datum
    elpd_i = _logsumexp(log_weights + lik)
    lppd_i = _logsumexp(lik) - np.log(n_samples)
    n_data = lik.shape[0]
    elpd = float(elpd_i.sum())
    se = float((n_data * np.var(elpd_i)) ** 0.5)
    p_loo = float(lppd_i.sum()) - elpd
    good_k = min(1 - 1 / np.log10(n_samples), 0.7)
    pareto_k = np.asarray(pareto_k, dtype=np.float64).reshape(-1)
    warning = bool(np.any(pareto_k > good_k))
    index = ["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning"]
    values: list[Any] = [elpd, se, p_loo, n_samples, n_data, warning]
    if pointwise:
        obs_coords = {d: ll[d].values for d in obs_dims}
        index += ["loo_i", "pareto_k"]
        values += [
            xr.DataArray(elpd_i.reshape(obs_shape), dims=obs_dims, coords=obs_coords, name="loo_i"),
            xr.DataArray(pareto_k.reshape(obs_shape), dims=obs_dims, coords=obs_coords, name="pareto_shape"),
        ]
    index += ["scale", "good_k", "approx_posterior"]
    values += ["log", good_k, True]
    return az.ELPDData(data=values, index=index)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=-1)
    return top + np.log(np.exp(x - top[..., None]).sum(axis=-1))


@dataclass(frozen=True)
class LooValues:
    """The numbers of a LOO result, named the same on both ArviZ lines."""

    elpd: float
    se: float
    p: float
    n_samples: int
    n_data_points: int
    good_k: float
    warning: bool
    pareto_k: np.ndarray | None  # per datum (pointwise results only)
    elpd_i: np.ndarray | None
    approx_posterior: bool


def loo_values(result: Any) -> LooValues:
    """Read an ArviZ 0.23 ``ELPDData`` (a pandas Series) or a 1.x ``ELPDData`` (attributes)."""
    if hasattr(result, "index") and "elpd_loo" in result.index:  # 0.23
        get = result.get
        k, e = get("pareto_k"), get("loo_i")
        return LooValues(
            float(result["elpd_loo"]),
            float(result["se"]),
            float(result["p_loo"]),
            int(result["n_samples"]),
            int(result["n_data_points"]),
            float(get("good_k", 0.7)),
            bool(result["warning"]),
            None if k is None else np.asarray(k),
            None if e is None else np.asarray(e),
            bool(get("approx_posterior", False)),
        )
    k, e = getattr(result, "pareto_k", None), getattr(result, "elpd_i", None)
    return LooValues(
        float(result.elpd),
        float(result.se),
        float(result.p),
        int(result.n_samples),
        int(result.n_data_points),
        float(result.good_k),
        bool(result.warning),
        None if k is None else np.asarray(k),
        None if e is None else np.asarray(e),
        bool(getattr(result, "approx_posterior", False)),
    )


# ------------------------------------------------------------------------------------------------
# plots (matplotlib figures on both lines)


def plot_posterior(data: Any, var_names: Sequence[str] | None = None, **kwargs: Any) -> Any:
    """Marginal posteriors: 0.23 ``az.plot_posterior``, 1.x ``az.plot_dist``. Returns the
    matplotlib ``Figure`` (close it with ``plt.close(fig)``). A name that only a data group holds is
    refused in one line (see :func:`summary`)."""
    names = list(var_names) if var_names is not None else None
    _refuse_data_names(data, names, kwargs.get("group"))
    if is_legacy():
        return _figure_of(az.plot_posterior(data, var_names=names, **kwargs))
    _refuse_ax(kwargs)
    return _figure_of_collection(az.plot_dist(data, var_names=names, backend="matplotlib", **kwargs))


def plot_forest(data: Any, var_names: Sequence[str] | None = None, **kwargs: Any) -> Any:
    """Forest plot of credible intervals (0.23: chains combined); returns the ``Figure``."""
    names = list(var_names) if var_names is not None else None
    _refuse_data_names(data, names, kwargs.get("group"))
    if is_legacy():
        kwargs.setdefault("combined", True)
        return _figure_of(az.plot_forest(data, var_names=names, **kwargs))
    _refuse_ax(kwargs)
    return _figure_of_collection(az.plot_forest(data, var_names=names, backend="matplotlib", **kwargs))


def _refuse_ax(kwargs: dict[str, Any]) -> None:
    """ArviZ 1.x (arviz-plots) lays out its own figure: an ``ax`` would be ignored, so say so."""
    if "ax" in kwargs:
        raise ValueError("on ArviZ 1.x the plot draws its own figure: call it without ax")


def _figure_of(axes: Any) -> Any:
    return np.ravel(np.asarray(axes, dtype=object))[0].get_figure()


def _figure_of_collection(collection: Any) -> Any:
    """The matplotlib figure of an arviz-plots ``PlotCollection``."""
    fig = collection.get_viz("figure")
    return fig.item() if hasattr(fig, "dims") else fig  # a 0-d DataArray in some versions
