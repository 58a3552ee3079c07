"""The Pyro settings the catalogue needs, switched on only inside the project's own calls.

Importing :mod:`pyro_invariance` changes nothing in Pyro or torch. Two process-wide switches are
turned on by :func:`pyro_scope` for the duration of a call, and restored on exit:

* ``pyro.settings`` ``module_local_params=True``: each :class:`~pyro.nn.PyroModule` (model or
  guide) keeps its parameters as its own ``nn.Parameter`` s instead of sharing them by name through
  the global param store. With Pyro's default (global) mode two catalogue models whose parameters
  have the same names (two ``basis-regression`` models, two ``AutoNormal`` guides) would silently
  share them: the second one picks up the first one's values from the store. ``fit`` trains
  ``model.parameters()`` and ``guide.parameters()`` with a plain torch optimiser, so it needs the
  module-local mode.
* the corrected ``KL(Delta ‖ ·)`` of :func:`pyro_invariance.distributions.corrected_delta_kl`
  (Pyro 1.9 drops ``Delta.log_density``, which biases ``TraceMeanField_ELBO`` on the constrained
  sites of packed autoguides).

Outside these calls Pyro behaves as its tutorials say: ``pyro.infer.SVI`` on a catalogue model
stores the parameters in the global param store (``pyro.get_param_store()``, ``save``,
``clear_param_store``), and the module takes its values from there by name -- so call
``pyro.clear_param_store()`` before training a second model of the same kind with plain Pyro, as
Pyro's tutorials do.

**Modules built under one mode and run under the other.** A ``PyroModule`` holds its parameters as
attributes in both modes; global mode also registers the same tensors in the param store by name.
So a model trained with a plain SVI loop and then evaluated by :func:`pyro_invariance.evaluate`
(module-local mode) sees its trained values, and a model fitted by :func:`pyro_invariance.fit` and
then passed to ``pyro.infer.Predictive`` (global mode) registers its own values in the store --
as long as the store holds no other module's parameters under the same names. Pyro 1.9 gives a
module constructed in global mode no local parameter state and fails when such a module is then
run in module-local mode (``AttributeError: '_Context' object has no attribute 'param_state'``);
inside :func:`pyro_scope` such a module gets an empty one when it is first entered.

Everything here is process-wide while it lasts (as Pyro's settings are): do not run plain Pyro code
in another thread while a project call runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pyro
from pyro.nn import module as _pyro_module

from pyro_invariance.distributions import corrected_delta_kl

__all__ = ["pyro_scope"]


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
