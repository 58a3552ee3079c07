"""Module modes around a computation that must not train (evaluation, bounds, ArviZ draws)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Put an ``nn.Module`` model in ``eval()`` mode for the block and restore its mode after.

    A model that is not an ``nn.Module`` (a plain Pyro callable) has no mode and is left as it is.
    """
    if not isinstance(model, nn.Module):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
