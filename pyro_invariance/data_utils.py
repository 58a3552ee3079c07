"""Turning user data into checked (x, y) tensors for training and evaluation."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pyro_invariance.validation import check_finite


def train_arrays(data: Any) -> tuple[Tensor, Tensor]:
    """``(x, y)`` training tensors from a dataset object (``x_train``/``y_train``) or a tuple."""
    if hasattr(data, "x_train") and hasattr(data, "y_train"):
        return _checked(data.x_train, data.y_train)
    return _checked(*_as_pair(data))


def test_arrays(data: Any) -> tuple[Tensor, Tensor]:
    """``(x, y)`` held-out tensors from a dataset object (``x_test``/``y_test``) or a tuple."""
    if hasattr(data, "x_test") and hasattr(data, "y_test"):
        return _checked(data.x_test, data.y_test)
    return _checked(*_as_pair(data))


def _as_pair(data: Any) -> tuple[Tensor, Tensor]:
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    raise TypeError(
        "data must be a dataset with x_train/y_train/x_test/y_test (see pyro_invariance.datasets) "
        f"or a pair (x, y) of tensors, got {type(data).__name__}"
    )


def _checked(x: Any, y: Any) -> tuple[Tensor, Tensor]:
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("data is empty")
    if x.dtype.is_floating_point:
        check_finite("x", x)
    if y.dtype.is_floating_point:
        check_finite("y", y)
    return x, y
