"""Input checks shared by models, training and the CLI (clear errors for bad input)."""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(name: str, value: Tensor) -> None:
    """Raise ``ValueError`` if ``value`` holds NaN or ±inf (says how many and where)."""
    bad = ~torch.isfinite(value)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(f"{name} contains {int(bad.sum())} non-finite values (NaN/inf), first at index {first}")


def check_labels(y: Tensor, batch: int, num_classes: int) -> None:
    """Class labels: integer dtype, shape ``(batch,)``, values in ``[0, num_classes)``."""
    if y.dim() != 1 or y.shape[0] != batch:
        raise ValueError(f"y must have shape ({batch},) to match x, got {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{int(y.min())}, {int(y.max())}]")


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``; else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_positive_float(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite positive number; else raise ``ValueError``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (v > 0 and v < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v
