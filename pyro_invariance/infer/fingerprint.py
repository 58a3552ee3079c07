"""What defines a run, so that ``resume`` continues *this* run and nothing else.

A resumed run loads its state from a checkpoint, so settings that live outside the state dict
(a model's ``num_samples``, ``sampling``, ``transform_on``; a fixed buffer such as the RFF weights
that ``lengthscale`` scales; the data) would otherwise change silently. :func:`run_fingerprint`
records, at the start of a run (after the guide's parameters exist, before any step):

* ``model`` / ``guide``: class, every submodule's plain settings (public ``int``/``float``/``str``/
  ``bool``/``None`` attributes and tuples of them), state-dict names, shapes and dtypes, and a
  SHA-256 of the buffers (fixed tensors such as RFF weights or generators follow from the
  constructor arguments; trained parameters are left out, as the checkpoint restores them);
* ``config``: the :class:`~pyro_invariance.infer.training.FitConfig`;
* ``data``: shapes, dtypes and a SHA-256 of ``x`` and ``y`` (after coercion);
* ``spec``: how the catalogue built model, guide and data, when given.

:func:`fingerprint_differences` lists, in words, what differs between two fingerprints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from pyro_invariance.infer.checkpoint import payload_digest

_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)


def module_settings(module: Any) -> dict[str, Any]:
    """``{"sub.attr": value}`` of the plain public attributes of ``module`` and its submodules."""
    out: dict[str, Any] = {}
    modules = module.named_modules() if isinstance(module, nn.Module) else [("", module)]
    for prefix, sub in modules:
        for key, value in sorted(vars(sub).items()):
            if key.startswith("_") or key == "training" or not _plain(value):
                continue
            out[f"{prefix}.{key}" if prefix else key] = value
    return out


def _state(module: Any) -> dict[str, Tensor]:
    return module.state_dict() if isinstance(module, nn.Module) else {}


def object_fingerprint(module: Any) -> dict[str, Any]:
    """Class, settings, state-dict layout and a digest of the buffers of ``module``."""
    state = _state(module)
    buffers = dict(module.named_buffers()) if isinstance(module, nn.Module) else {}
    return {
        "class": f"{type(module).__module__}.{type(module).__qualname__}",
        "settings": module_settings(module),
        "layout": {k: f"{v.dtype}{tuple(v.shape)}" for k, v in state.items() if isinstance(v, Tensor)},
        "values": payload_digest(buffers),
    }


def tensor_digest(t: Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and bytes."""
    return payload_digest(t)


def data_fingerprint(x: Tensor, y: Tensor) -> dict[str, Any]:
    """Shapes, dtypes and content digests of the training data."""
    return {
        "x": f"{x.dtype}{tuple(x.shape)}",
        "y": f"{y.dtype}{tuple(y.shape)}",
        "sha256": hashlib.sha256((tensor_digest(x) + tensor_digest(y)).encode()).hexdigest(),
    }


def run_fingerprint(
    model: Any, guide: Any, config: dict[str, Any], x: Tensor, y: Tensor, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything that defines a run (see module docstring)."""
    return {
        "model": object_fingerprint(model),
        "guide": object_fingerprint(guide),
        "config": dict(config),
        "data": data_fingerprint(x, y),
        "spec": spec,
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dict_diff(part: str, saved: dict[str, Any], now: dict[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    out = []
    for key in sorted(set(saved) | set(now), key=str):
        if key in ignore:
            continue
        if key not in saved:
            out.append(f"{part} '{key}' is new ({_short(now[key])})")
        elif key not in now:
            out.append(f"{part} '{key}' is gone (was {_short(saved[key])})")
        elif saved[key] != now[key]:
            out.append(f"{part} '{key}': saved {_short(saved[key])}, now {_short(now[key])}")
    return out


def fingerprint_differences(saved: dict[str, Any], now: dict[str, Any], ignore_config: Iterable[str] = ()) -> list[str]:
    """What differs between two :func:`run_fingerprint` s, one phrase per difference."""
    out: list[str] = []
    for part in ("model", "guide"):
        s, n = saved.get(part, {}), now.get(part, {})
        if s.get("class") != n.get("class"):
            out.append(f"{part} class: saved {s.get('class')}, now {n.get('class')}")
            continue
        out += _dict_diff(f"{part} setting", s.get("settings", {}), n.get("settings", {}))
        out += _dict_diff(f"{part} tensor", s.get("layout", {}), n.get("layout", {}))
        if not out and s.get("values") != n.get("values"):
            out.append(f"{part} buffers differ (fixed tensors built from other constructor arguments)")
    out += _dict_diff("setting", saved.get("config", {}), now.get("config", {}), ignore=ignore_config)
    sd, nd = saved.get("data", {}), now.get("data", {})
    if sd != nd:
        same_shape = sd.get("x") == nd.get("x") and sd.get("y") == nd.get("y")
        out.append(
            f"data: saved x {sd.get('x')}, y {sd.get('y')}; now x {nd.get('x')}, y {nd.get('y')}"
            + ("; same shapes, different values" if same_shape else "")
        )
    if saved.get("spec") is not None and now.get("spec") is not None:
        out += _dict_diff("spec", saved["spec"], now["spec"])
    return out
