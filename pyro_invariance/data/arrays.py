"""Turning user data into checked ``(x, y)`` tensors for training and evaluation — once, at the API boundary.

``data`` is a dataset object (``x_train``/``y_train``/``x_test``/``y_test``, see
:mod:`pyro_invariance.data.images`) or a pair ``(x, y)`` of tensors, numpy arrays or lists.

**With a model** (``train_arrays(data, model)``, what :func:`pyro_invariance.fit`,
:func:`pyro_invariance.evaluate` and the other evaluation entry points use) the data are
converted and checked once, before any compute, so that no training step has to:

* ``x``: any real dtype → the model's floating dtype (:func:`~pyro_invariance.validation.model_dtype`:
  its first floating parameter or buffer; ``torch.get_default_dtype()`` if none). Integer
  (e.g. uint8) ``x`` is converted **as-is, without scaling**, unless the dataset object has an
  attribute ``input_scale`` (a positive float, e.g. ``1/255``), which then multiplies integer ``x``
  (float ``x`` is taken as already scaled and never multiplied). Complex or bool ``x``,
  non-finite values and values whose squares overflow the dtype (about 1.8e19 in float32: the
  gradients and Adam's second moments would overflow, :func:`~pyro_invariance.validation.check_magnitude`)
  raise ``ValueError``.
* ``y`` for classification models (an integer ``num_classes`` attribute): integer dtypes → int64;
  float labels holding whole numbers → int64 (numpy's float labels); other floats raise; *every*
  label is checked against ``[0, num_classes)`` (the message gives the range found and the first
  bad row).
* ``y`` for regression / dynamics models: the model's floating dtype, checked finite and not too large
  (as ``x``).
* shapes: checked against the model (``model.prepare_inputs(x, y)`` of every
  :class:`PreparesInputs`, which every :class:`~pyro_invariance.models.base.CatalogueModel` is); any
  other model gets the dtype rule above (integer ``y`` of a model without ``num_classes`` is left as
  it is).

Tensors keep their device (the caller moves them). **Without a model** (``train_arrays(data)``:
before a model exists, or to convert later) the tensors come back as given (``torch.as_tensor``)
after the row-count, emptiness and finiteness checks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from pyro_invariance.validation import as_real_tensor, check_finite, check_positive_float, coerce_pair, model_dtype


class PreparesInputs(ABC):
    """A model that converts and checks its own data: ``prepare_inputs(x, y) -> (x, y)``.

    :class:`~pyro_invariance.models.base.CatalogueModel` derives from it. It is declared here, with
    the data, so that the data modules ask the models' side of the boundary by type without
    importing the models (which import the data modules).
    """

    @abstractmethod
    def prepare_inputs(self, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Checked ``(x, y)`` for this model (see :meth:`CatalogueModel.prepare_inputs
        <pyro_invariance.models.base.CatalogueModel.prepare_inputs>`)."""


def train_arrays(data: Any, model: Any = None) -> tuple[Tensor, Tensor]:
    """``(x, y)`` training tensors from a dataset object (``x_train``/``y_train``) or a pair.

    With ``model``, converted and checked for it (see the module docstring for the dtype rule).
    """
    if hasattr(data, "x_train") and hasattr(data, "y_train"):
        return prepare_arrays(data.x_train, data.y_train, model, _input_scale(data))
    return prepare_arrays(*_as_pair(data), model)


def test_arrays(data: Any, model: Any = None) -> tuple[Tensor, Tensor]:
    """``(x, y)`` held-out tensors from a dataset object (``x_test``/``y_test``) or a pair.

    With ``model``, converted and checked for it (see the module docstring for the dtype rule).
    """
    if hasattr(data, "x_test") and hasattr(data, "y_test"):
        return prepare_arrays(data.x_test, data.y_test, model, _input_scale(data))
    return prepare_arrays(*_as_pair(data), model)


def prepare_arrays(x: Any, y: Any, model: Any = None, input_scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Checked ``(x (N, ...), y (N, ...))`` from arrays; for ``model`` when given.

    ``input_scale`` multiplies integer ``x`` (see the module docstring); it needs a model.
    """
    if model is None:  # no model to convert for: as given
        x, y = torch.as_tensor(x), torch.as_tensor(y)
    else:
        x, y = as_real_tensor("x", x), as_real_tensor("y", y)
    if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("data is empty")
    if model is None:
        return _checked(x, y)
    if input_scale is not None and not x.is_floating_point():
        x = x.to(model_dtype(model)) * input_scale
    if isinstance(model, PreparesInputs):  # every catalogue model
        return model.prepare_inputs(x, y)  # type: ignore[return-value]
    return coerce_pair(model, x, y)  # type: ignore[return-value]


def _input_scale(data: Any) -> float | None:
    scale = getattr(data, "input_scale", None)
    return None if scale is None else check_positive_float("input_scale", scale)


def _as_pair(data: Any) -> tuple[Any, Any]:
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    raise TypeError(
        "data must be a dataset with x_train/y_train/x_test/y_test (see pyro_invariance.data.images) "
        f"or a pair (x, y) of tensors, got {type(data).__name__}"
    )


def _checked(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    if x.dtype.is_floating_point:
        check_finite("x", x)
    if y.dtype.is_floating_point:
        check_finite("y", y)
    return x, y
