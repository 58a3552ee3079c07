"""Input checks shared by models, training and the CLI (clear errors for bad input).

Three kinds of checks live here:

* **argument checks**, one function per kind of argument, used by every entry point that takes it:
  :func:`check_seed` (every seed lies in ``0 … 2**32 − 1``), :func:`check_device` (a device this
  machine has), :func:`check_positive_int`, :func:`check_positive_float` (numbers, not text);
* **boundary checks** (:func:`model_dtype`, :func:`as_real_tensor`, :func:`coerce_inputs`,
  :func:`coerce_labels`, :func:`coerce_targets`, used by every catalogue model's ``prepare_inputs``
  (:class:`pyro_invariance.models.base.CatalogueModel`)): run once per call of ``fit`` / ``evaluate`` on the whole
  data set; they look at the values (non-finite inputs, inputs whose squares overflow
  (:func:`check_magnitude`), labels outside ``[0, num_classes)``), which costs one host
  synchronisation on a GPU;
* **per-forward checks** (:func:`check_label_shape`, shapes in the models' ``forward``): shapes
  and dtypes only, never a value, so that a training step never waits for the device.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor


def check_finite(name: str, value: Tensor) -> None:
    """Raise ``ValueError`` if ``value`` holds NaN or ±inf (says how many and where).

    Looks at every value (one host synchronisation on a GPU): for the data boundary, not for a
    model's ``forward``.
    """
    bad = ~torch.isfinite(value)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(f"{name} contains {int(bad.sum())} non-finite values (NaN/inf), first at index {first}")


def check_label_shape(y: Tensor, batch: int) -> None:
    """Per-forward check of class labels without reading them: shape ``(batch,)``, integer dtype.

    The values (``[0, num_classes)``) are checked once at the data boundary
    (:func:`coerce_labels`); inside a user's own SVI loop Pyro's validation rejects labels outside
    the Categorical's support when the ELBO scores them.
    """
    if y.dim() != 1 or y.shape[0] != batch:
        raise ValueError(f"y must have shape ({batch},) to match x, got {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")


def check_labels(y: Tensor, batch: int, num_classes: int) -> None:
    """Class labels: integer dtype, shape ``(batch,)``, values in ``[0, num_classes)``.

    Reads the values (a host synchronisation on a GPU): use it at a data boundary, not per step.
    """
    check_label_shape(y, batch)
    _check_label_range(y, num_classes)


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``; else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_positive_float(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite positive number; else raise ``ValueError``.

    Text (``"0.1"``) and booleans are refused, not converted: a number typed as text is a mistake
    somewhere upstream, and converting it here only would leave other places holding the text.
    """
    if isinstance(value, (str, bytes, bool)):
        raise ValueError(f"{name} must be a positive number, got the {type(value).__name__} {value!r}")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (v > 0 and v < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


#: The largest seed: numpy's ``np.random.seed`` (which ``pyro.set_rng_seed`` calls) takes 0 … 2**32 − 1.
SEED_MAX = 2**32 - 1


def check_seed(value: object, name: str = "seed") -> int:
    """Return ``value`` as int if it is an integer in ``[0, SEED_MAX]`` (not a bool); else ``ValueError``.

    One range for every seed of the package (training, evaluation, ArviZ export, the CLI): the
    narrowest of the generators a seed reaches (numpy's), so no seed fails deep inside a run.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer in 0…{SEED_MAX} (2**32 - 1), got {value!r}")
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer in 0…{SEED_MAX} (2**32 - 1), got {value}")
    return int(value)


def derived_seed(seed: int, offset: int) -> int:
    """``seed + offset`` wrapped into ``[0, SEED_MAX]``: a second stream derived from a checked seed
    stays a valid seed (``seed + 1`` of ``SEED_MAX`` would not)."""
    return (int(seed) + int(offset)) % (SEED_MAX + 1)


class DeviceError(ValueError, RuntimeError):
    """A device that does not exist on this machine. A ``ValueError`` (a bad argument) that is also a
    ``RuntimeError``, what ``fit`` raised for a missing GPU before devices were checked here."""


def available_devices() -> list[str]:
    """The device strings a run may use on this machine: ``"cpu"``; ``"cuda"`` and ``"cuda:0"`` …
    ``"cuda:<n-1>"`` when CUDA is available; ``"mps"`` when Apple's MPS is."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out += ["mps", "mps:0"]
    return out


def check_device(value: object, name: str = "device") -> str:
    """``value`` (a string or ``torch.device``) as a device string this machine has; else a one-line
    :class:`DeviceError` naming ``name``, the value and the devices available here."""
    text = str(value) if isinstance(value, torch.device) else value
    if isinstance(text, str) and text.strip() in available_devices():
        return text.strip()
    allowed = available_devices()
    why = ""
    if isinstance(text, str) and text.strip().startswith("cuda"):
        why = (
            " (torch.cuda.is_available() is False here)"
            if not torch.cuda.is_available()
            else f" (this machine has {torch.cuda.device_count()} CUDA device(s))"
        )
    raise DeviceError(f"{name} must be one of {', '.join(map(repr, allowed))} on this machine, got {value!r}{why}")


def check_subset_size(name: str, size: object, available: int) -> int:
    """``size`` examples of ``available`` (``None``: all): an integer in ``[1, available]``."""
    if size is None:
        return available
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {size!r}")
    if size > available:
        raise ValueError(f"{name}={size} exceeds the {available} examples available")
    return int(size)


def check_data_dir(data_dir: str | os.PathLike[str] | None, name: str = "data_dir") -> None:
    """Refuse a ``data_dir`` that names an existing file: a data folder is never a file."""
    if data_dir is not None and os.path.isfile(os.path.expanduser(os.fspath(data_dir))):
        raise ValueError(f"{name} must be a folder, got the file {os.fspath(data_dir)!r}")


def refuse_data_dir(dataset: str, **paths: Any) -> None:
    """For datasets that read no files (generated data): refuse any path given as ``data_dir``/``root``."""
    for arg, value in paths.items():
        if value is not None:
            raise ValueError(
                f"{arg}={os.fspath(value)!r} does not apply to dataset {dataset!r}: its data are generated, "
                "not read from files; leave it out"
            )


# ------------------------------------------------------------------------------------------------
# The data boundary: coercion and value checks, once per fit / evaluate


def model_dtype(model: Any) -> torch.dtype:
    """The floating dtype of ``model``: its first floating parameter, else its first floating
    buffer, else ``torch.get_default_dtype()`` (also for plain functions)."""
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return torch.get_default_dtype()


def as_real_tensor(name: str, value: Any) -> Tensor:
    """``value`` (tensor, numpy array, list) as a tensor of a real dtype, device unchanged.

    Raises ``ValueError`` naming ``name`` for complex, bool or non-numeric values.
    """
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()  # torch.as_tensor warns on read-only arrays
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a numeric array or tensor, got {type(value).__name__} ({exc})") from None
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold real numbers, got dtype {t.dtype}")
    return t


def coerce_inputs(name: str, x: Tensor, dtype: torch.dtype) -> Tensor:
    """Inputs as floating ``dtype`` (integers converted as-is, no scaling), checked finite and not
    too large to train on (:func:`check_magnitude`)."""
    x = as_real_tensor(name, x).to(dtype)
    check_finite(name, x)
    check_magnitude(name, x)
    return x


def check_magnitude(name: str, value: Tensor) -> None:
    """Refuse floating values whose squares overflow their dtype (``|v| > sqrt(finfo.max)``, about
    1.8e19 in float32), with the reason, in one line.

    Such data are numerically hopeless rather than merely badly scaled: the first gradients grow
    with the inputs, and Adam's second moment (the squared gradient) overflows to inf, which freezes
    the parameters it belongs to at their start while the loss stays finite — a run that looks
    trained and is not. Gradients that overflow for smaller inputs (large N/B, deep products) are
    caught while training (:func:`first_overflowed_state`).
    """
    if not value.is_floating_point() or not value.numel():
        return
    limit = math.sqrt(torch.finfo(value.dtype).max)
    largest = float(value.abs().max())
    if largest > limit:
        first = tuple(int(i) for i in (value.abs() > limit).nonzero()[0].tolist())
        raise ValueError(
            f"{name} holds values up to {largest:.3g} in magnitude (first at index {first}); above {limit:.3g} their "
            f"squares overflow {value.dtype}, so the gradients and Adam's second moments overflow and the parameters "
            f"stop learning: rescale {name} (e.g. standardise it)"
        )


def first_overflowed_state(optimizer: torch.optim.Optimizer, owners: dict[str, Any]) -> str | None:
    """Which parameter's optimiser state (e.g. Adam's ``exp_avg_sq``) is no longer finite, as one
    line with the reason; ``None`` when all of it is finite (one host synchronisation).

    Adam divides by the square root of its second moment: once a squared gradient overflows to inf,
    that parameter's updates are zero for good while the loss stays finite, so a run would go on
    without learning it. ``owners`` (e.g. ``{"model": model, "guide": guide}``) name the parameters.
    """
    names = {
        id(p): f"{owner} parameter {n!r}"
        for owner, module in owners.items()
        if isinstance(module, torch.nn.Module)
        for n, p in module.named_parameters()
    }
    entries = [
        (p, key, t)
        for group in optimizer.param_groups
        for p in group["params"]
        for key, t in optimizer.state.get(p, {}).items()
        if isinstance(t, Tensor) and t.is_floating_point() and t.numel()
    ]
    if not entries:
        return None
    finite = torch.stack([torch.isfinite(t).all().to(entries[0][2].device) for _, _, t in entries])
    if bool(finite.all()):
        return None
    p, key, t = entries[int((~finite).nonzero()[0, 0])]
    limit = math.sqrt(torch.finfo(t.dtype).max)
    return (
        f"the optimiser state {key!r} of {names.get(id(p), 'a parameter')} overflowed to inf (gradients above "
        f"{limit:.3g}, whose squares {t.dtype} cannot hold): that parameter stops learning while the loss "
        "stays finite; the data are likely too large for this model: rescale them (e.g. standardise x and y)"
    )


def coerce_targets(name: str, y: Tensor, dtype: torch.dtype) -> Tensor:
    """Regression / dynamics targets as floating ``dtype``, checked finite."""
    return coerce_inputs(name, y, dtype)


def coerce_labels(y: Tensor, num_classes: int, name: str = "y") -> Tensor:
    """Class labels ``(N,)`` as int64, every value checked against ``[0, num_classes)``.

    Integer dtypes are converted as they are; float labels must hold whole numbers (numpy users'
    ``1.0, 0.0, ...``), anything else raises ``ValueError`` naming ``name``, the bad value and
    its row.
    """
    y = as_real_tensor(name, y)
    if y.dim() != 1:
        raise ValueError(f"{name} must hold one class label per row, shape (N,), got {tuple(y.shape)}")
    if y.is_floating_point():
        bad = ~(torch.isfinite(y) & (y == y.round()))
        if bad.any():
            row = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{name} must hold integer class labels, got the value {float(y[row])!r} in row {row} (dtype {y.dtype})"
            )
    _check_label_range(y, num_classes, name)
    return y.to(torch.int64)


def _check_label_range(y: Tensor, num_classes: int, name: str = "y") -> None:
    if not y.numel():
        return
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        lo, hi = _fmt_number(y.min()), _fmt_number(y.max())
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name} has labels in [{lo}, {hi}] (first bad row {row}), but labels must lie in "
            f"[0, {num_classes}) for the model's {num_classes} classes"
        )


def _fmt_number(value: Tensor) -> str:
    v = float(value)
    return str(int(v)) if math.isfinite(v) and v == int(v) else repr(v)


def _shape_text(shapes: Sequence[tuple[int, ...]]) -> str:
    return " or ".join("(" + ", ".join(["B", *map(str, s)]) + ")" for s in shapes)


def check_trailing_shape(name: str, value: Tensor, shapes: Sequence[tuple[int, ...]]) -> None:
    """``value`` must have shape ``(B, *s)`` for one ``s`` of ``shapes`` (no value is read)."""
    if not isinstance(value, Tensor) or value.dim() < 1 or tuple(value.shape[1:]) not in [tuple(s) for s in shapes]:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must have shape {_shape_text(shapes)}, got {got}")


@runtime_checkable
class Classifier(Protocol):
    """The contract of a classification model (catalogue or not): an integer ``num_classes``."""

    num_classes: int


def num_classes_of(model: Any) -> int | None:
    """``model.num_classes`` when the model is a :class:`Classifier` with an integer count, else ``None``."""
    if not isinstance(model, Classifier):
        return None
    c = model.num_classes
    return int(c) if isinstance(c, (int, np.integer)) and not isinstance(c, bool) else None


def coerce_pair(model: Any, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The dtype rule of :mod:`pyro_invariance.data.arrays` for any model (no shape checks).

    ``x`` → ``model_dtype(model)``, checked finite. ``y``: class labels (int64, range checked) when
    the model has an integer ``num_classes``; otherwise float ``y`` → the model's dtype, checked
    finite, and integer ``y`` unchanged (an unknown model may take integer targets).
    """
    dtype = model_dtype(model)
    x = coerce_inputs("x", x, dtype)
    if y is None:
        return x, None
    classes = num_classes_of(model)
    if classes is not None:
        return x, coerce_labels(y, classes)
    y = as_real_tensor("y", y)
    return x, coerce_targets("y", y, dtype) if y.is_floating_point() else y


# ------------------------------------------------------------------------------------------------
# The model protocol: ``model(x, y=None)``, with ``num_data=N`` where the model takes it


def takes_num_data(model: Any) -> bool:
    """Whether ``model(x, y, num_data=N)`` is accepted: its ``forward`` (or the function itself) has a
    ``num_data`` parameter or ``**kwargs``.

    Pyro's convention is ``model(x, y=None)``; the catalogue's models also take ``num_data``, the size
    of the data set a minibatch comes from, and scale their likelihood by ``N/B``
    (``pyro.plate("data", num_data, subsample_size=B)``). A model without it is scored on the rows it
    is given, so it is fitted full batch (:func:`pyro_invariance.infer.training.fit`).
    """
    target = getattr(model, "forward", model)
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume Pyro's plain convention
        return False
    return any(p.name == "num_data" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def num_data_kwargs(model: Any, num_data: int) -> dict[str, int]:
    """``{"num_data": num_data}`` for a model that takes it (:func:`takes_num_data`), else ``{}``: the
    keyword arguments with which the workbench calls ``model`` and its guide."""
    return {"num_data": int(num_data)} if takes_num_data(model) else {}


#: modules whose frames stand between a user's call and the line that warns: this package's, and the wrappers of
#: its entry points (context-manager decorators, functools.wraps)
_NOT_THE_CALLER = ("pyro_invariance", "contextlib", "functools")


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside :data:`_NOT_THE_CALLER`, so the
    warning names the user's line (a fixed ``stacklevel`` names whichever wrapper of ``fit`` happens to be there)."""
    frame, level = sys._getframe(1), 2  # level 2: warn_user's caller
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _NOT_THE_CALLER:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
