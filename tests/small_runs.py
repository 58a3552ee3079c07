"""Small invariant-MLP runs on 8×8 rotated digits shared by the training, run-safety and input tests, and the
basis regression with a latent λ that the symmetry-posterior guide tests share."""

from __future__ import annotations

from typing import Any

import torch

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.images import load_dataset


def small_digits() -> Any:
    """256 training and 64 test 8×8 rotated digits."""
    return load_dataset("rotated-digits", train_size=256, test_size=64)


def small_model(**kw: Any) -> Any:
    """An invariant MLP with H = 16 and S = 4 (other arguments as given)."""
    kw.setdefault("hidden", 16)
    kw.setdefault("num_transforms", 4)
    return pi.models.get("invariant-mlp", image_shape=(1, 8, 8), **kw)


def small_fit(data: Any, model_kw: dict | None = None, guide: str = "block-cholesky", seed: int = 5, **kw: Any) -> Any:
    """``pi.fit`` of :func:`small_model` (12 steps, batch 64 unless given)."""
    model = small_model(**(model_kw or {}))
    kw.setdefault("steps", 12)
    kw.setdefault("batch_size", 64)
    return pi.fit(model, guides.get(guide, model), data, progress=False, seed=seed, **kw)


def fit_state(result: Any) -> dict[str, torch.Tensor]:
    """Model and guide state of a fit result, keys prefixed ``m.`` / ``g.``."""
    return {
        **{f"m.{k}": v for k, v in result.model.state_dict().items()},
        **{f"g.{k}": v for k, v in result.guide.state_dict().items()},
    }


def basis_lambda_conditional(**guide_kw: Any) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """``(model, guide, x, y)``: the ``basis-regression-lambda`` reference model and data with a set-up
    symmetry-conditional guide (``guide_kw`` passed to it)."""
    from pyro_invariance.diagnostics.reference import entry
    from pyro_invariance.infer.training import set_up_guide

    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get("symmetry-conditional", model, **guide_kw)
    set_up_guide(model, guide, x[:2], y[:2], num_data=x.shape[0])
    return model, guide, x, y
