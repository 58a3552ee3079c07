"""The Pyro settings the catalogue needs, switched on only inside the project's own calls.

Importing :mod:`pyro_invariance` changes nothing in Pyro or torch. Two process-wide switches are
turned on by :func:`pyro_scope` for the duration of a call, and restored on exit:

* ``pyro.settings`` ``module_local_params=True``: each :class:`~pyro.nn.PyroModule` (model or
  guide) keeps its parameters as its own ``nn.Parameter`` s instead of sharing them by name through
  the global param store. With Pyro's default (global) mode two modules whose parameters have the
  same names (two of Pyro's ``AutoNormal`` guides) silently share them: the second one picks up the
  first one's values from the store (catalogue models and guides guard against that outside these
  calls too, :func:`own_params_in_store`, at the cost of a look at the store per call). ``fit`` trains
  ``model.parameters()`` and ``guide.parameters()`` with a plain torch optimiser, so it needs the
  module-local mode.
* the corrected ``KL(Delta ‖ ·)`` of :func:`pyro_invariance.distributions.corrected_delta_kl`
  (Pyro 1.9 drops ``Delta.log_density``, which biases ``TraceMeanField_ELBO`` on the constrained
  sites of Pyro's own packed autoguides, e.g. a user's ``AutoMultivariateNormal`` passed to ``fit``).
  The catalogue's guides do not depend on it: they put the package's
  :class:`~pyro_invariance.distributions.DensityDelta` at such sites, whose KL rule is registered at
  import, so their bounds are the same inside and outside this scope.

Outside these calls Pyro behaves as its tutorials say: ``pyro.infer.SVI`` on a catalogue model
stores the parameters in the global param store (``pyro.get_param_store()``, ``save``, ``load``,
``clear_param_store``) under Pyro's names, and a module takes values put there by name (``load``).
One difference keeps a fitted result its own wherever it is used: each call of a catalogue model or
guide runs under :func:`own_params_in_store`, so it never takes, nor trains, the tensors of another
live catalogue model or guide that the store holds under the same names (two fits of one model, or
an ``invariant-mlp`` and a ``rotation-toy-2d``, which both name η ``eta_unit``); the store then lists
the parameters of the module that ran last.

**Modules built under one mode and run under the other.** A ``PyroModule`` holds its parameters as
attributes in both modes; global mode also registers the same tensors in the param store by name.
So a model trained with a plain SVI loop and then evaluated by :func:`pyro_invariance.evaluate`
(module-local mode) sees its trained values, and a model fitted by :func:`pyro_invariance.fit` and
then passed to ``pyro.infer.Predictive`` (global mode) registers its own values in the store
(for a module that is not a catalogue one: as long as the store holds no other module's parameters
under the same names). Pyro 1.9 gives a
module constructed in global mode no local parameter state and fails when such a module is then
run in module-local mode (``AttributeError: '_Context' object has no attribute 'param_state'``);
inside :func:`pyro_scope` such a module gets an empty one when it is first entered.

Everything here is process-wide while it lasts (as Pyro's settings are): do not run plain Pyro code
in another thread while a project call runs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import pyro
import torch
from pyro.nn import module as _pyro_module

from pyro_invariance.distributions import corrected_delta_kl

__all__ = ["own_params_in_store", "pyro_scope"]


class _LazyParamState:
    """Non-data descriptor: an empty module-local param state for a ``_Context`` built without
    one (in global mode). Set on the instance on first access, so each context gets its own."""

    def __get__(self, ctx: Any, owner: type | None = None) -> Any:
        if ctx is None:
            return self
        state: dict[str, dict] = {"params": {}, "constraints": {}}
        ctx.__dict__["param_state"] = state
        return state


@contextlib.contextmanager
def _local_param_state_for_global_modules() -> Iterator[None]:
    ctx_cls = _pyro_module._Context
    added = "param_state" not in ctx_cls.__dict__
    if added:
        ctx_cls.param_state = _LazyParamState()
    try:
        yield
    finally:
        if added and isinstance(ctx_cls.__dict__.get("param_state"), _LazyParamState):
            del ctx_cls.param_state


@contextlib.contextmanager
def pyro_scope() -> Iterator[None]:
    """Run a block (or, as ``@pyro_scope()``, a function) with the catalogue's Pyro settings.

    ``module_local_params=True`` and the corrected ``KL(Delta ‖ ·)``, both restored on exit
    (nested scopes are fine). Every public entry point of the package (``fit``, ``fit_laplace``,
    ``evaluate``, ``compare_guides``, the evidence bounds, ``to_inference_data``, the reference
    posteriors, the CLI) runs inside it; use it around your own loop to get the same behaviour::

        with pi.pyro_scope():
            loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss(model, guide, x, y)
    """
    with _local_param_state_for_global_modules(), corrected_delta_kl(), pyro.settings.context(module_local_params=True):
        yield


#: the parameters of the catalogue models and guides that have run in Pyro's global mode, which the store
#: may hold; weak, so a tensor the store has let go of no longer counts. Tensors, not modules: the store
#: keeps a collected module's tensors alive, and they must not pass by name into another fit's module
_STORE_TENSORS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def _parameter_ids(modules: Iterable[torch.nn.Module]) -> set[int]:
    return {id(p) for m in modules for p in m.parameters()}


@contextlib.contextmanager
def own_params_in_store(module: torch.nn.Module) -> Iterator[None]:
    """Run one call of a catalogue model or guide (``module``) so that, in Pyro's global mode, it
    uses only its own parameters and those put into the store by name.

    In global mode a ``PyroModule`` looks its parameters up in the global param store by name and, when
    the store holds another tensor under that name, replaces its own with it (a guide being set up
    starts from it): two fitted catalogue results with the same names would share, read and train
    each other's values. So for the length of the outermost call, the store's entries that are
    parameters of another catalogue module (live, or collected while the store still holds its tensors)
    are taken out; the module registers its own tensors
    under those names, and an entry whose name it did not register is put back afterwards. Entries
    of no such module (``pyro.get_param_store().load``, a plain ``pyro.param``) stay visible: the
    module takes them by name, as in Pyro. In module-local mode (:func:`pyro_scope`), and in calls
    nested in the module's own, it changes nothing.
    """
    if pyro.settings.get("module_local_params") or module._pyro_context.active:
        yield
        return
    store = pyro.get_param_store()
    others = set(_STORE_TENSORS.keys()) - _parameter_ids([module])
    # named_parameters() lists the unconstrained tensors; the constraints have no public getter
    hidden = {n: (t, store._constraints[n]) for n, t in store.named_parameters() if id(t) in others}
    for name in hidden:
        del store[name]
    try:
        yield
    finally:
        back = {n: tc for n, tc in hidden.items() if n not in store}
        store.set_state(
            {"params": {n: t for n, (t, _) in back.items()}, "constraints": {n: c for n, (_, c) in back.items()}}
        )
        _STORE_TENSORS.update({id(p): p for p in module.parameters()})
