"""The heavy third-party libraries that only some calls need, imported on first use.

Importing the package should cost what torch and Pyro cost and little more: ArviZ alone (with the
SciPy, xarray and pandas it loads) takes longer to import than Pyro, and most uses of the package
(fit, evaluate, the CLI's tables) never touch it. So the libraries below are not imported when the
package is; each is a :class:`Deferred` stand-in for the module, which imports it at its first
attribute access and then forwards to it::

    from pyro_invariance._optional import pyplot as plt

    fig = plt.figure()          # matplotlib.pyplot is imported here, once

This module is the one place where such libraries are named; the rest of the package imports
them from here (``tests/test_layers.py`` checks that package modules import no package module
inside a function, and this module is what makes that possible for the optional ones). It imports
nothing of the package (and no torch), so the torch-free ArviZ tests can load it from its file.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = [
    "Deferred",
    "arviz",
    "arviz_stats",
    "pyplot",
    "scipy_integrate",
    "scipy_stats",
    "sklearn_datasets",
    "sklearn_model_selection",
    "torchvision_datasets",
    "xarray",
]


class Deferred:
    """A module imported at the first attribute access (then cached by Python's ``sys.modules``).

    ``needed_for`` says which calls need it (shown in ``repr`` and in the error when it is missing).
    """

    def __init__(self, name: str, needed_for: str) -> None:
        object.__setattr__(self, "_deferred_name", name)
        object.__setattr__(self, "_deferred_for", needed_for)

    def load(self) -> ModuleType:
        """The module itself (imported now if it was not yet)."""
        try:
            return importlib.import_module(self._deferred_name)
        except ImportError as exc:
            raise ImportError(f"{self._deferred_name} is needed for {self._deferred_for}: {exc}") from exc

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:  # e.g. a test's monkeypatch.setattr(az, ...)
        setattr(self.load(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self.load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self.load())

    def __repr__(self) -> str:
        return f"<deferred module {self._deferred_name!r} (for {self._deferred_for})>"


#: ArviZ: the InferenceData export, summaries, LOO and PSIS k̂ (``diagnostics.arviz_compat``, ``infer.psis``).
arviz = Deferred("arviz", "the ArviZ export, summaries, LOO and PSIS k̂")
#: arviz-stats (ArviZ 1.x only): registers the ``.azstats`` accessor that PSIS k̂ uses there.
arviz_stats = Deferred("arviz_stats", "PSIS k̂ on ArviZ 1.x")
#: xarray: the containers of the ArviZ export.
xarray = Deferred("xarray", "the ArviZ export")
#: matplotlib.pyplot: every figure (``diagnostics.plots`` and the analyses' plotting functions).
pyplot = Deferred("matplotlib.pyplot", "figures")
#: scipy.integrate: ``solve_ivp`` (DOP853) for the physics datasets' trajectories.
scipy_integrate = Deferred("scipy.integrate", "the physics datasets' trajectories")
#: scipy.stats: Wasserstein distances when guides are scored against NUTS reference posteriors.
scipy_stats = Deferred("scipy.stats", "scoring against reference posteriors")
#: scikit-learn's bundled 8×8 digits and its stratified split (the ``rotated-digits`` family).
sklearn_datasets = Deferred("sklearn.datasets", "the digits datasets")
sklearn_model_selection = Deferred("sklearn.model_selection", "the digits datasets' split")
#: torchvision's downloadable image datasets (MNIST and friends).
torchvision_datasets = Deferred("torchvision.datasets", "the torchvision image datasets")
