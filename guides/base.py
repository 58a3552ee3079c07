"""Shared machinery of the catalogue's guides.

:class:`StructuredGuide` is an :class:`~pyro.infer.autoguide.AutoNormal` (Pyro's per-site
mean-field guide) in which selected sites get a structured distribution instead of a
mean-field Normal. It keeps Pyro's autoguide contract: parameters are built lazily from the
model's prototype trace on the first call (``_setup_prototype``), plate/subsample and
observed sites are skipped, parameters are constrained :class:`~pyro.nn.PyroParam` s,
``forward(*args, **kwargs)`` returns ``{site name: sampled value}``, and ``median()`` /
``quantiles()`` work.

Unlike ``AutoNormal`` it samples each site directly from its guide distribution -- no auxiliary
``<name>_unconstrained`` site and ``Delta`` -- so that :class:`~pyro.infer.TraceMeanField_ELBO`
finds an analytic KL wherever one exists:

* real-support site:     ``q = Normal(loc, scale).to_event(event_dim)``;
* constrained site:      ``q = TransformedDistribution(Normal(loc, scale), biject_to(support))``
  (the transform caches its input, so ``log q`` of the guide's own sample is exact;
  identity parts of the transform are dropped and elementwise transforms are applied before
  ``to_event``, so a ``LogNormal`` prior -- also ``LogNormal(...).to_event(n)`` -- gets the
  analytic ``KL(Normal ‖ Normal)`` of the base distributions);
* structured site:       whatever the subclass builds (:class:`MatrixNormal`,
  :class:`RowwiseMultivariateNormal`).

(Pyro 1.9's ``AutoNormal`` puts the log-Jacobian into ``Delta.log_density``, which Pyro's
``KL(Delta ‖ ·)`` dropped; :mod:`pyro_invariance.distributions` corrects that KL for the
packed autoguides inside :func:`pyro_invariance.pyro_scope`, and this class avoids the
indirection altogether.)

:func:`num_guide_parameters` counts a guide's free parameters. :func:`check_guide_for` refuses a
catalogue guide used with a model other than the one it was built for.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from itertools import chain
from operator import attrgetter
from typing import Any, ClassVar

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoGuide, AutoNormal
from pyro.infer.autoguide.initialization import InitMessenger, init_to_feasible
from pyro.infer.autoguide.utils import deep_setattr, helpful_support_errors
from pyro.nn import PyroModule, PyroParam
from pyro.ops.tensor_utils import periodic_repeat
from pyro.poutine.messenger import Messenger
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.transforms import AffineTransform, ComposeTransform, IndependentTransform, Transform

import pyro_invariance.distributions  # noqa: F401  (registers the analytic KLs)
from pyro_invariance._pyro_scope import own_params_in_store, pyro_scope

InitLocFn = Callable[[dict], Tensor]
SiteSelector = None | bool | int | Iterable[str] | Callable[[str, str, int], bool]

#: The one default ``init_scale`` of every catalogue guide (class and factory alike): where Pyro's
#: autoguides start. From 1.0 (as wide as a unit prior) ordinary models trained badly: full-rank
#: on a small sine-regression BNN ended at test RMSE 1.64 after 1000 steps (0.164 from 0.1), and on a
#: linear-Gaussian model block-Cholesky and matrix-normal stayed 0.14 and 0.11 nats short of a
#: posterior they can represent after 4000 ``fit`` steps (0.03 from 0.1;
#: benchmarks/results/guide_convergence.md). A catalogue model that needs another start
#: says so in its ``guide_defaults``, with the measured reason (the invariant MLP and the 2-D
#: rotation toy keep 1.0).
DEFAULT_INIT_SCALE = 0.1


def check_init_scale(init_scale: Any) -> float:
    """``init_scale`` as a float; anything that is not a finite number > 0 raises ValueError."""
    if isinstance(init_scale, bool) or not isinstance(init_scale, numbers.Real):
        raise ValueError(f"init_scale must be a number > 0, got {init_scale!r}")
    init_scale = float(init_scale)
    if not (init_scale > 0 and math.isfinite(init_scale)):
        raise ValueError(f"init_scale must be a finite number > 0, got {init_scale!r}")
    return init_scale


def _is_real_support(support: constraints.Constraint) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real or type(support) is type(constraints.real)


def _is_identity(t: Transform) -> bool:
    if not isinstance(t, AffineTransform):
        return False
    loc, scale = t.loc, t.scale
    return bool(torch.all(torch.as_tensor(loc) == 0)) and bool(torch.all(torch.as_tensor(scale) == 1))


def _simplify(t: Transform) -> Transform:
    """Drop identity affine parts from ``biject_to``'s transforms, so that e.g. the positive
    reals' ``exp ∘ (x + 0)`` becomes ``exp``: a guide ``TransformedDistribution`` then has the
    same transforms as a ``LogNormal`` prior and ``KL(q ‖ p)`` is analytic (``KL(Normal ‖ Normal)``)."""
    if isinstance(t, IndependentTransform):
        return IndependentTransform(_simplify(t.base_transform), t.reinterpreted_batch_ndims)
    if isinstance(t, ComposeTransform):
        parts = [_simplify(p) for p in t.parts if not _is_identity(p)]
        if len(parts) == 1:
            return parts[0]
        return ComposeTransform(parts) if parts else t
    return t


def is_matrix_site(site: dict) -> bool:
    """True for a latent site whose value is one real ``(rows, cols)`` matrix declared with
    event dim 2 (e.g. ``Normal(0., s).expand([C, H]).to_event(2)``, not inside any plate).
    These are the sites the matrix-normal and block-Cholesky guides structure; every other
    latent site gets a mean-field Normal."""
    fn = site["fn"]
    return site["value"].dim() == 2 and fn.event_dim == 2 and len(fn.batch_shape) == 0 and _is_real_support(fn.support)


#: where Pyro's site-wise autoguides keep a site's own parameters: ``<container>.<site>``
OWN_SITE_CONTAINERS = ("locs", "scales", "scale_trils", "conds")


def own_site_parameters(guide: torch.nn.Module, sites: Sequence[str]) -> list[Tensor]:
    """The parameters a site-wise guide keeps for ``sites`` themselves (``locs.<site>``,
    ``scales.<site>``, ``scale_trils.<site>``, ``conds.<site>.…``), by Pyro's autoguide naming; a
    site with none (the guide draws it jointly with others) is refused in one line."""
    named = list(guide.named_parameters())
    out = []
    for site in sites:
        own = [
            p
            for n, p in named
            for c in OWN_SITE_CONTAINERS
            if n in (f"{c}.{site}", f"{c}.{site}_unconstrained") or n.startswith(f"{c}.{site}.")
        ]
        if not own:
            raise ValueError(
                f"{type(guide).__name__} has no parameters of its own for site {site!r} (it draws "
                "it jointly with other latents, or is not set up yet); use a site-wise guide "
                "(mean-field, symmetry-conditional)"
            )
        out.extend(own)
    return out


class CatalogueGuide:
    """What every catalogue guide declares (a mixin of the registered guide classes).

    ``fit_defaults``: :class:`~pyro_invariance.infer.config.FitConfig` settings this family
    recommends; they rank below the model's ``fit_defaults`` and explicit settings
    (:mod:`pyro_invariance.infer.config`).

    ``catalogue_name``: the family's registry name (:func:`pyro_invariance.guides.get`), for messages
    and exports; ``None`` for a class that no entry builds.

    A catalogue guide records the model it was built for (:class:`ModelSignature`):
    :func:`check_guide_for` refuses it with any other model whose latent sites differ.
    """

    fit_defaults: ClassVar[Mapping[str, Any]] = {}
    catalogue_name: ClassVar[str | None] = None

    def __init__(self, model: Callable, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)  # type: ignore[call-arg]  (the autoguide's)
        # private (not a fingerprinted setting); plain data, so it outlives Pyro's reference to the model
        self._built_for = model_signature(model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The autoguide's call that, in Pyro's global param mode (outside the package's calls), sets up,
        reads and trains this guide's own parameters, never another catalogue guide's of the same name
        (:func:`~pyro_invariance._pyro_scope.own_params_in_store`)."""
        assert isinstance(self, torch.nn.Module)
        with own_params_in_store(self):
            return super().__call__(*args, **kwargs)  # type: ignore[misc]

    def symmetry_guide_parameters(self, sites: Sequence[str]) -> list[Tensor]:
        """q(η)'s own parameters for the symmetry ``sites`` (a set-up guide), e.g. to hold q(η) fixed
        while the rest trains (a warm-up of q(θ | η) across a wide, held q(η)).
        Site-wise guides find them by Pyro's naming (:func:`own_site_parameters`); a guide that draws
        η jointly with the weights has none and is refused in one line."""
        assert isinstance(self, torch.nn.Module)
        return own_site_parameters(self, sites)

    def symmetry_condition(self, site: str, value: Tensor) -> dict[str, Tensor]:
        """The guide's sample sites and values that put its draw of the symmetry ``site`` at ``value``
        (for ``poutine.condition``), so that its other sites are drawn from q(θ | η = value): here the site
        itself (a site-wise guide whose draw of θ does not depend on η). A guide that draws η jointly with
        the weights is refused in one line (:func:`own_site_parameters`)."""
        assert isinstance(self, torch.nn.Module)
        own_site_parameters(self, [site])
        return {site: value}


class StructuredGuide(CatalogueGuide, AutoNormal):
    """AutoNormal-style guide with optional structured sites (see module docstring).

    Subclasses override :meth:`_is_structured`, :meth:`_make_structured` (returns a
    :class:`~pyro.nn.PyroModule` holding the site's parameters, with a ``distribution()``
    method) and may override :meth:`_check_setup`.

    Args:
        model: a Pyro model (e.g. a catalogue ``PyroModule``).
        init_loc_fn: per-site initialisation of the means (Pyro's ``init_to_*``); the default
            ``init_to_feasible`` gives 0 for real sites and 1 for positive ones.
        init_scale: initial standard deviation of every (unconstrained) latent coordinate
            (default :data:`DEFAULT_INIT_SCALE`, 0.1, Pyro's; a catalogue model may recommend
            another through ``guide_defaults``).
        create_plates: as in Pyro's autoguides.
    """

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: InitLocFn = init_to_feasible,
        init_scale: float = DEFAULT_INIT_SCALE,
        create_plates: Callable | None = None,
    ) -> None:
        super().__init__(
            model, init_loc_fn=init_loc_fn, init_scale=check_init_scale(init_scale), create_plates=create_plates
        )

    # -- hooks --------------------------------------------------------------------------------
    def _is_structured(self, name: str, site: dict) -> bool:
        return False

    def _make_structured(self, name: str, site: dict, init_loc: Tensor) -> PyroModule:
        """Build the parameters of structured site ``name``; a subclass whose :meth:`_is_structured`
        marks sites must override it (the base class marks none, so it is never called there)."""
        raise NotImplementedError(f"{type(self).__name__} marks site {name!r} structured but does not build it")

    def _check_setup(self) -> None:
        """Called once the prototype trace is known (validate site-name options here)."""

    # -- setup --------------------------------------------------------------------------------
    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        AutoGuide._setup_prototype(self, *args, **kwargs)  # trace the model; skip AutoNormal's params

        self._event_dims: dict[str, int] = {}
        self._structured_names: list[str] = []
        self.locs = PyroModule()
        self.scales = PyroModule()
        self.structured = PyroModule()
        self._check_setup()

        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if self._is_structured(name, site):
                deep_setattr(self.structured, name, self._make_structured(name, site, site["value"].detach()))
                self._structured_names.append(name)
                continue
            # Mean-field Normal in unconstrained space, exactly as AutoNormal does it.
            with helpful_support_errors(site):
                init_loc = biject_to(site["fn"].support).inv(site["value"].detach()).detach()
            event_dim = site["fn"].event_dim + init_loc.dim() - site["value"].dim()
            self._event_dims[name] = event_dim
            for frame in site["cond_indep_stack"]:  # subsampled plate: repeat to full size
                full_size = frame.full_size or frame.size
                if full_size != frame.size:
                    init_loc = periodic_repeat(init_loc, full_size, frame.dim - event_dim).contiguous()
            deep_setattr(self.locs, name, PyroParam(init_loc, constraints.real, event_dim))
            deep_setattr(
                self.scales,
                name,
                PyroParam(torch.full_like(init_loc, self._init_scale), self.scale_constraint, event_dim),
            )

    def _structured_site(self, name: str) -> PyroModule:
        return attrgetter(name)(self.structured)

    def _support_transform(self, name: str, support: constraints.Constraint) -> Transform:
        """``_simplify(biject_to(support))``, built once per site and support object: the identity
        test reads the transform's tensors, which on a GPU would be a host synchronisation per step."""
        cache = self.__dict__.setdefault("_support_transforms", {})
        key = (name, id(support))
        if key not in cache:
            cache[key] = (support, _simplify(biject_to(support)))  # the support kept alive: its id stays unique
        return cache[key][1]

    def _mean_field_distribution(self, name: str, site: dict) -> dist.TorchDistribution:
        loc, scale = self._get_loc_and_scale(name)
        q = dist.Normal(loc, scale)
        event_dim = self._event_dims[name]
        support = site["fn"].support
        if _is_real_support(support):
            return q.to_event(event_dim) if event_dim else q
        transform = self._support_transform(name, support)
        if (
            isinstance(transform, IndependentTransform)
            and transform.base_transform.domain.event_dim == 0
            and transform.reinterpreted_batch_ndims == event_dim
        ):  # elementwise: Independent(TransformedDistribution) matches e.g. LogNormal(...).to_event(n)
            q = dist.TransformedDistribution(q, transform.base_transform.with_cache(1))
            return q.to_event(event_dim)
        if event_dim:
            q = q.to_event(event_dim)
        return dist.TransformedDistribution(q, transform.with_cache(1))

    def get_distribution(self, name: str) -> dist.TorchDistribution:
        """The guide's distribution ``q`` of site ``name`` at the current parameters."""
        if self.prototype_trace is None:
            raise RuntimeError("call the guide once (with the model's arguments) before get_distribution()")
        site = self.prototype_trace.nodes[name]
        if name in self._structured_names:
            return self._structured_site(name).distribution()
        return self._mean_field_distribution(name, site)

    # -- AutoGuide API ------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Sample every latent site of the model; returns ``{name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        plates = self._create_plates(*args, **kwargs)
        result = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            with ExitStack() as stack:
                for frame in site["cond_indep_stack"]:
                    if frame.vectorized:
                        stack.enter_context(plates[frame.name])
                if name in self._structured_names:
                    q = self._structured_site(name).distribution()
                else:
                    q = self._mean_field_distribution(name, site)
                result[name] = pyro.sample(name, q)
        return result

    @torch.no_grad()
    def median(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Posterior median of every latent site (the mean for Gaussian sites)."""
        medians = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if name in self._structured_names:
                medians[name] = self._structured_site(name).loc.detach().clone()
            else:
                loc, _ = self._get_loc_and_scale(name)
                median = biject_to(site["fn"].support)(loc)
                medians[name] = median.clone() if median is loc else median
        return medians

    @torch.no_grad()
    def quantiles(self, quantiles: list | Tensor, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Marginal posterior quantiles of every latent site, shape ``(len(quantiles),) + site shape``."""
        results = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if name in self._structured_names:
                q = self._structured_site(name).distribution()
                loc, scale = q.mean, q.variance.sqrt()
            else:
                loc, scale = self._get_loc_and_scale(name)
            qs = torch.as_tensor(quantiles, dtype=loc.dtype, device=loc.device)
            qs = qs.reshape((-1,) + (1,) * loc.dim())
            values = dist.Normal(loc, scale).icdf(qs)
            if name not in self._structured_names:
                values = biject_to(site["fn"].support)(values)
            results[name] = values
        return results


class MeanFieldNormal(StructuredGuide):
    """Mean-field Normal guide: an independent Normal per latent coordinate (in unconstrained
    space), one guide site per model site. Pyro's :class:`~pyro.infer.autoguide.AutoNormal`
    with direct sampling so :class:`~pyro.infer.TraceMeanField_ELBO` uses analytic KLs (see
    :class:`StructuredGuide`). Parameters: ``locs.<site>``, ``scales.<site>``."""

    catalogue_name = "mean-field"


# --------------------------------------------------------------------------------------------
def _constraint_free_count(constraint: constraints.Constraint, shape: torch.Size) -> int:
    """Number of free coordinates of a parameter of ``shape`` under ``constraint``."""
    numel = math.prod(shape)
    if isinstance(constraint, constraints.independent):
        constraint = constraint.base_constraint
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        n = shape[-1]
        batch = math.prod(shape[:-2])
        if isinstance(constraint, type(constraints.unit_lower_cholesky)):
            return batch * n * (n - 1) // 2
        if isinstance(constraint, (type(constraints.lower_cholesky), type(constraints.lower_triangular))):
            return batch * n * (n + 1) // 2
        if isinstance(constraint, type(constraints.corr_cholesky)):
            return batch * n * (n - 1) // 2
    return numel


def num_guide_parameters(guide: torch.nn.Module, *args: Any, effective: bool = True, **kwargs: Any) -> int:
    """Number of trainable parameters of ``guide``.

    Args:
        guide: any guide module (ours, Pyro's autoguides, ``AutoGuideList``).
        *args: the model's arguments (and ``**kwargs``); only needed when the guide has not been
            called yet (its parameters are created lazily on the first call).
        effective: count free coordinates rather than stored entries: a unit-lower-triangular
            ``n×n`` factor counts ``n(n−1)/2``, a lower-Cholesky one ``n(n+1)/2`` (they are
            stored as full ``n×n`` tensors). Frozen factors (buffers) never count.

    Returns:
        The count, e.g. ``D(D+3)/2`` for a full-rank Gaussian over ``D`` coordinates.
    """
    if getattr(guide, "prototype_trace", "missing") is None:
        if not (args or kwargs):
            raise RuntimeError("the guide has no parameters yet: pass the model's arguments or call it once")
        with torch.no_grad(), poutine.block():
            guide(*args, **kwargs)
    total = 0
    for module in guide.modules():
        pyro_params = getattr(module, "_pyro_params", {})
        for pname, param in module._parameters.items():
            if param is None or not param.requires_grad:
                continue
            base = pname[: -len("_unconstrained")] if pname.endswith("_unconstrained") else None
            if effective and base in pyro_params:
                total += _constraint_free_count(pyro_params[base][0], param.shape)
            else:
                total += param.numel()
    return total


# --------------------------------------------------------------------------------------------
# the model a guide was built for

#: a latent site's signature: value shape and dtype
SiteSignature = tuple[tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class ModelSignature:
    """What a guide remembers of the model it was built for: the class, its plain public settings
    (for messages, e.g. ``hidden=16``) and its latent sites (:func:`latent_sites`). Plain data, so
    it survives ``copy.deepcopy`` and pickling, which drop Pyro's own reference to the model."""

    cls: type
    settings: dict[str, Any]
    sites: dict[str, SiteSignature]


def _zero_point(site: dict) -> Tensor:
    """The point at 0 in a site's unconstrained coordinates, without a random draw (Pyro's
    ``init_to_feasible`` draws a sample for its shape, which advances the RNG and costs a full draw)."""
    fn = site["fn"]
    try:
        like = fn.mean
    except NotImplementedError:  # e.g. a logit-normal: one draw for shape, dtype and device (RNG forked)
        like = fn.sample()
    transform = biject_to(fn.support)
    return transform(torch.zeros_like(transform.inv(like)))


def latent_sites(model: PyroModule) -> dict[str, SiteSignature]:
    """``{site: (shape, dtype)}`` of the latent sites a ``PyroModule`` declares (its ``PyroSample``
    attributes and those of its submodules), without data: each prior is evaluated at a feasible
    point (:func:`_zero_point`, no random numbers), so the RNG and the model's state are left as they were."""
    cuda = sorted({t.device for t in chain(model.parameters(), model.buffers()) if t.device.type == "cuda"}, key=str)
    context = model._pyro_context  # the cache of one model call: a prior read twice is one site
    used = context.used  # (a module never called may still become another one's submodule: keep it so)
    try:
        with (
            pyro_scope(),
            torch.no_grad(),
            torch.random.fork_rng(devices=cuda),
            poutine.block(),
            poutine.trace() as tracer,
            InitMessenger(_zero_point),
            context,
        ):
            for module in model.modules():
                if isinstance(module, PyroModule):
                    for name in list(module.__dict__.get("_pyro_samples", {})):
                        # PyroModule's own lookup: a class property of the same name may hide the site
                        PyroModule.__getattr__(module, name)
    finally:
        context.used = used
    return {
        name: (tuple(site["value"].shape), site["value"].dtype)
        for name, site in tracer.trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"]
    }


def model_signature(model: Any) -> ModelSignature | None:
    """The :class:`ModelSignature` of a ``PyroModule``; ``None`` for anything else, or for a module whose
    priors cannot be drawn without a model call (they read state that ``forward`` sets): no verdict."""
    if not isinstance(model, PyroModule):
        return None
    try:
        sites = latent_sites(model)
    except Exception:  # noqa: BLE001  (a user's model: the guide then goes unchecked, as before)
        return None
    plain = (bool, int, float, str, type(None), tuple)
    settings = {
        k: v for k, v in vars(model).items() if not k.startswith("_") and k != "training" and isinstance(v, plain)
    }
    return ModelSignature(type(model), settings, sites)


def _site_difference(built: dict[str, SiteSignature], now: dict[str, SiteSignature]) -> tuple[str, str] | None:
    """The first latent site in which two models differ, as ``(built model's, this model's)`` words."""

    def words(name: str, sig: SiteSignature | None, other: SiteSignature | None) -> str:
        if sig is None:
            return f"no site {name!r}"
        if other is not None and sig[0] == other[0]:
            return f"site {name!r} dtype {str(sig[1]).replace('torch.', '')}"
        return f"site {name!r} shape {sig[0]}"

    for name in [*built, *(n for n in now if n not in built)]:
        if built.get(name) != now.get(name):
            return words(name, built.get(name), now.get(name)), words(name, now.get(name), built.get(name))
    return None


def _model_of(guide: Any) -> Any:
    """The model a Pyro autoguide holds, unwrapped from the handlers the autoguide put around it
    (``InitMessenger``); ``None`` once Pyro dropped it (a pickled or deep-copied guide)."""
    held = guide.__dict__.get("_model")
    fn = held[0] if isinstance(held, tuple) and held else None
    while isinstance(fn, partial) and len(fn.args) == 2 and isinstance(fn.args[0], Messenger):
        fn = fn.args[1]  # Messenger(fn) is partial(_context_wrap, messenger, fn)
    return fn


def check_guide_for(model: Any, guide: Any) -> None:
    """Refuse, in one line, a catalogue guide used with a model other than the one it was built for.

    A catalogue guide records the model it was built for (:class:`ModelSignature`). The same model
    object always passes. A *different* object passes when it is of the same class and declares the
    same latent sites with the same shapes and dtypes: a fresh copy of the model (``copy.deepcopy``, or
    the model rebuilt with the same arguments) is a legitimate home for a guide fitted before. Another
    class, or any latent site whose name, shape or dtype differs (a model built with other sizes), is
    refused with a ``ValueError`` naming the first difference and how to build the guide for this model.

    Not checked (their sites cannot be compared without running them): guides that are not catalogue
    guides (Pyro's own autoguides, plain functions, wrappers around a catalogue guide), and guides built for,
    or used with, a model that is not a ``PyroModule``.
    """
    built = guide.__dict__.get("_built_for") if isinstance(guide, CatalogueGuide) else None
    if built is None or _model_of(guide) is model or not isinstance(model, PyroModule):
        return
    name = guide.catalogue_name
    label = name or type(guide).__name__
    remedy = "build the guide for this model with " + (f"pi.guides.get({name!r}, model)" if name else f"{label}(model)")
    if type(model) is not built.cls:
        raise ValueError(
            f"guide {label!r} was built for another model ({built.cls.__name__}); this model is "
            f"a {type(model).__name__}: {remedy}"
        )
    now = model_signature(model)
    difference = None if now is None else _site_difference(built.sites, now.sites)
    if now is None or difference is None:
        return
    before, after = built.settings, now.settings
    changed = [k for k in before if k in after and before[k] != after[k]][:3]  # e.g. hidden=16 vs hidden=32
    was = " with " + ", ".join(f"{k}={before[k]!r}" for k in changed) if changed else ""
    has = ", ".join(f"{k}={after[k]!r}" for k in changed) + " and " if changed else ""
    raise ValueError(
        f"guide {label!r} was built for another model ({built.cls.__name__}{was}: {difference[0]}); "
        f"this model has {has}{difference[1]}: {remedy}"
    )
