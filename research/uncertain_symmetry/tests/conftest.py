"""Test-session setup of the research tests, as the library's (``tests/conftest.py``): matplotlib draws
headless (Agg, unless ``MPLBACKEND`` is set), torch runs one thread, and the session runs inside
:func:`pyro_invariance.pyro_scope`, as the library's own calls do."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

import pyro_invariance as pi  # noqa: E402

# One thread everywhere (the project's rule): CI has 2 shared cores, where torch's two threads make small
# operations many times slower, and results must not depend on the thread count.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _library_pyro_settings():
    with pi.pyro_scope():
        yield
