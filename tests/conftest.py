"""Test-session setup shared by every test file.

The package never selects a matplotlib backend (its plot functions return figures, matplotlib's
convention); the tests draw headless, so they ask for Agg here, before any test module imports
matplotlib. A backend chosen outside (``MPLBACKEND=...``) is kept.

Pyro settings: importing the package changes none (``tests/test_import_side_effects.py``); its calls
run inside :func:`pyro_invariance.pyro_scope`. Many tests call models and guides directly (ELBOs,
traces, ``guide.median()``) and build several models with the same parameter names, so the whole
session runs inside that scope too, as the library's own calls do. A test marked ``plain_pyro`` runs
with Pyro's defaults instead (global param store, Pyro's own ``KL(Delta ‖ ·)``).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
try:  # the ArviZ-1 environment (make test-arviz1) is torch-free
    import torch
except ImportError:  # pragma: no cover
    pass
else:
    # One thread everywhere (the project's rule): CI has 2 shared cores, where torch's two threads
    # make small operations many times slower, and results must not depend on the thread count.
    torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "plain_pyro: run with Pyro's default settings, outside pyro_invariance.pyro_scope()"
    )


@pytest.fixture(scope="session", autouse=True)
def _library_pyro_settings():
    try:
        import pyro_invariance as pi
    except ImportError:  # the torch-free ArviZ 1.x environment (make test-arviz1) tests arviz_compat only
        yield
        return
    with pi.pyro_scope():
        yield


@pytest.fixture(autouse=True)
def _plain_pyro(request: pytest.FixtureRequest):
    if request.node.get_closest_marker("plain_pyro") is None:
        yield
        return
    import pyro
    from pyro.distributions import Delta
    from pyro.distributions import kl as pyro_kl
    from pyro.distributions.distribution import Distribution
    from torch.distributions import kl as torch_kl

    key, ours = (Delta, Distribution), torch_kl._KL_REGISTRY[(Delta, Distribution)]
    torch_kl._KL_REGISTRY[key] = pyro_kl._kl_delta  # Pyro's own rule, as without the package
    torch_kl._KL_MEMOIZE.clear()
    try:
        with pyro.settings.context(module_local_params=False):
            yield
    finally:
        torch_kl._KL_REGISTRY[key] = ours
        torch_kl._KL_MEMOIZE.clear()
