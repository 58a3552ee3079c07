"""Building catalogue entries from names: model × guide × dataset, and rebuilding saved runs.

:func:`model_kwargs_for` fills the arguments a model can take from the dataset
(``image_shape``, ``num_classes`` for images; ``state_dim``, ``dt`` for physics data) so the CLI,
tutorials and tests build any entry the same way.
A *spec* ``{"model", "model_kwargs", "guide", "guide_kwargs", "data", "data_kwargs"}`` records how
a run was built; :func:`load_run` rebuilds model, guide and data from a checkpoint's spec.

:func:`check_model_fits_data` refuses a catalogue model on a dataset whose rows it cannot take (a
dynamics model on images, ...) before anything is fitted, naming the registered datasets that fit.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from pyro import poutine

import pyro_invariance.guides as guide_registry  # guides.get: with the model's recommended defaults
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.infer.checkpoint import CheckpointError, load_checkpoint
from pyro_invariance.models.base import CatalogueModel
from pyro_invariance.registry import DATASETS, MODELS
from pyro_invariance.validation import check_trailing_shape


def _accepts(factory: Any, name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def model_kwargs_for(name: str, dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """Model keyword arguments: ``kwargs`` plus what the dataset determines (shape, classes)."""
    factory = MODELS.entry(name).factory
    out = dict(kwargs)
    if dataset is not None:
        if _accepts(factory, "image_shape") and hasattr(dataset, "image_shape"):
            out.setdefault("image_shape", list(dataset.image_shape))
        if _accepts(factory, "num_classes") and hasattr(dataset, "num_classes"):
            out.setdefault("num_classes", int(dataset.num_classes))
        if _accepts(factory, "state_dim") and hasattr(dataset, "state_dim"):
            out.setdefault("state_dim", int(dataset.state_dim))
        if _accepts(factory, "dt") and hasattr(dataset, "dt"):
            out.setdefault("dt", float(dataset.dt))
    return out


def model_data_kind(model: Any) -> tuple[str, str] | None:
    """The kind of data a catalogue model takes, as datasets declare it when they register
    (``kind=``): its task's name and whether its rows are images (an input shape ``(C, h, w)``) or
    vectors; ``None`` for other models."""
    if not isinstance(model, CatalogueModel):
        return None
    return model.task.name, "images" if any(len(shape) == 3 for shape in model.input_shapes()) else "vectors"


def datasets_for(model: Any) -> list[str]:
    """Registered datasets whose declared ``kind`` is the one ``model`` takes, sorted."""
    kind = model_data_kind(model)
    return [e.name for e in DATASETS.items() if kind is not None and e.info.get("kind") == kind]


def check_model_fits_data(model_name: str, model: Any, data_name: str, data: Any) -> None:
    """Refuse ``data`` (a dataset object) whose rows the catalogue model cannot take, in one line that
    says which registered datasets fit; no value is read. Pairs and other models are left to the
    data boundary (:func:`~pyro_invariance.data.arrays.train_arrays`)."""
    if not isinstance(model, CatalogueModel) or not (hasattr(data, "x_train") and hasattr(data, "y_train")):
        return
    try:
        check_trailing_shape("x", torch.as_tensor(data.x_train), model.input_shapes())
        check_trailing_shape("y", torch.as_tensor(data.y_train), model.target_shapes())
    except ValueError as exc:
        fits = datasets_for(model)
        if data_name in fits:  # the right kind of data, another size: the model's shape arguments
            hint = "build the model with this dataset's shapes (leave image_shape / state_dim out to take them)"
        else:
            task, rows = model_data_kind(model) or ("", "")
            hint = f"{model_name} is a {task} model on {rows}; datasets that fit: {', '.join(fits) or 'none'}"
        raise ValueError(f"model {model_name!r} does not fit dataset {data_name!r} ({exc}): {hint}") from None


def build(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Dataset, model and guide from a spec (see module docstring); a model that cannot take the
    dataset's rows is refused here (:func:`check_model_fits_data`)."""
    data = DATASETS.get(spec["data"], **spec.get("data_kwargs", {})) if spec.get("data") else None
    model_kwargs = model_kwargs_for(spec["model"], data, **spec.get("model_kwargs", {}))
    spec["model_kwargs"] = model_kwargs
    model = MODELS.get(spec["model"], **model_kwargs)
    if data is not None:
        check_model_fits_data(spec["model"], model, spec["data"], data)
    guide = guide_registry.get(spec["guide"], model, **spec.get("guide_kwargs", {}))
    return data, model, guide


@pyro_scope()
def load_run(checkpoint_path: str | Path, data: Any = None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Rebuild ``(model, guide, data, checkpoint)`` from a checkpoint written by ``fit`` with a spec.

    The checkpoint is read safely and verified (:func:`~pyro_invariance.infer.checkpoint.load_checkpoint`:
    ``weights_only=True``, format version, checksum) before anything is built from it.
    """
    state = load_checkpoint(checkpoint_path)
    spec = state.get("spec")
    if not spec:
        raise CheckpointError(f"checkpoint {str(checkpoint_path)!r} has no spec: rebuild model and guide yourself")
    built_data, model, guide = build(dict(spec))
    if data is not None:
        check_model_fits_data(spec["model"], model, str(getattr(data, "name", type(data).__name__)), data)
    data = data if data is not None else built_data
    x, y = train_arrays(data, model)
    with poutine.block(), torch.no_grad():
        guide(x[:2], y[:2], num_data=x.shape[0])  # create the guide's lazily built parameters
    try:
        model.load_state_dict(state["model"])
        guide.load_state_dict(state["guide"])
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint does not match its spec: {exc}") from exc
    return model, guide, data, state
