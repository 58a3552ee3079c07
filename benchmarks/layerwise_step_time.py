"""Time per training step of the layer-wise networks (ELLA, paper 004) vs a plain torch twin.

Issue 14, part 6. For each model (default ``layerwise-conv`` and ``layerwise-f-fc+conv``, input
3×32×32, 10 classes, width ``--alpha``) three variants are timed, interleaved:

* ``pyro-map``          the body of :func:`pyro_invariance.fit`'s loop with the ``map`` guide and
                        ``prior="fixed"`` (δ = 1): minibatch gather, ``TraceMeanField_ELBO
                        .differentiable_loss`` + finiteness check + ``backward`` + Adam (``fit``'s
                        parameter groups and rates, :data:`~pyro_invariance.models.layerwise.FIT_DEFAULTS`)
                        + cosine scheduler + ``loss.item()``. Pyro's validation is on (its default).
* ``pyro-map+laplace``  the same plus the diagonal-GGN Laplace evidence update of
                        :func:`pyro_invariance.infer.laplace.fit_laplace` (its callback
                        :class:`~pyro_invariance.infer.laplace.LaplaceEvidenceUpdate`: curvature on
                        minibatches of 32 over the training set, log evidence, MacKay's update) every
                        ``LAPLACE_EVERY`` = 10 steps.
* ``twin``              a plain torch ``nn.Module`` with the same convolutions and pathways
                        (:class:`TwinNet`: ``nn.Conv2d`` with circular padding at stride 1 and the
                        same per-example polyphase selection, the same F-FC einsums, the same head),
                        the same parameter count, loss = (N/B)·cross-entropy + the L2 prior term
                        ½ Σ δ‖θ‖², one Adam group (lr 0.01) + cosine scheduler + finiteness check +
                        ``loss.item()``. Before timing it is loaded with the Pyro MAP point and its
                        loss and gradients are checked against Pyro's (reported).

Optional variants (``--variants``): ``pyro-map-noval`` (``pyro-map`` after
``pyro.enable_validation(False)``); ``pyro-map-before`` and ``pyro-map+laplace-before`` (the same
steps with the layer-wise forward as it was before issue 14 part 6 — :func:`before_forward` swaps
the old block forward, circular padding and polyphase selection in for the duration of each step —
so that before and after are timed interleaved in one process); ``twin-strided`` (the twin with
stride-2 convolutions instead of stride 1 + polyphase selection: what a plain CNN of this size would
do; a different model); ``fit-lean``, ``fit-capture`` and ``fit-cudagraphs`` (:func:`make_lean_step`:
``fit``'s lean step of issue 14 — validation off, the lean ELBO, fused Adam, no host read or
finiteness check per step — eagerly, replaying the captured loss, or replaying it as CUDA graphs:
``fit(compile="off" | "capture" | "cudagraphs")``).

Timing: the training set is ``train_size`` random images (default 2·batch; it is also N of the
likelihood scale N/B and the data of the Laplace curvature); every variant runs chunks of
``LAPLACE_EVERY`` consecutive steps, chunk by chunk in rotated order, so the Laplace variant's chunk
holds exactly one update. Reported per variant: the amortised ms/step (chunk time / 10; median and
IQR over chunks), the single-step median and IQR, and the paired ratio to ``twin`` (each chunk over
the twin chunk of the same repetition). On CUDA every step ends in ``loss.item()`` (a
synchronisation), so wall time is device time. Peak memory (:func:`memory_probe`, one probe per
variant: a warm-up step, then two steps, the Laplace variants updating at each): the peak of the
memory allocated during the two steps above what was allocated before them (what a step needs on
top of parameters, optimiser state and data) — on CUDA from ``torch.cuda.max_memory_allocated``, on
CPU from the running total of the CPU allocator's allocations and frees recorded by
``torch.profiler(profile_memory=True)``. Not the resident set: it stays up where the allocator
keeps freed memory, and a child process's ``resource`` ``ru_maxrss`` starts at its parent's
resident set; no tracemalloc (it does not see torch's allocations).

``--profile SIZES`` adds torch.profiler (CPU activity) tables of the top aten ops of ``pyro-map``,
``pyro-map-before``, ``pyro-map-noval`` and ``twin`` at those sizes. :func:`measure_layerwise` is the API (``benchmarks/gpu_step_time.py`` imports it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

import pyro  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pyro import poutine  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from pyro_invariance import guides, pyro_scope  # noqa: E402
from pyro_invariance.infer import training  # noqa: E402
from pyro_invariance.infer.config import resolve_config  # noqa: E402
from pyro_invariance.infer.fast_step import CapturedLoss, LeanTraceMeanField_ELBO, make_optimizer  # noqa: E402
from pyro_invariance.infer.laplace import LaplaceEvidenceUpdate  # noqa: E402
from pyro_invariance.registry import MODELS  # noqa: E402
from pyro_invariance.symmetry import equivariant_layers as L  # noqa: E402

MODEL_NAMES: tuple[str, ...] = ("layerwise-conv", "layerwise-f-fc+conv")
VARIANTS: tuple[str, ...] = ("pyro-map", "pyro-map+laplace", "twin")
EXTRA_VARIANTS: tuple[str, ...] = ("pyro-map-noval", "pyro-map-before", "pyro-map+laplace-before", "twin-strided",
                                    "fit-lean", "fit-capture", "fit-cudagraphs")  # fmt: skip
#: steps between two Laplace updates; also the timing chunk of every variant
LAPLACE_EVERY = 10
#: minibatch of the Laplace curvature (``fit_laplace``'s default ``ggn_batch_size``)
GGN_BATCH = 32
IMAGE_SHAPE: tuple[int, int, int] = (3, 32, 32)
NUM_CLASSES = 10
TWIN_LR = 1e-2
#: what ``peak_mem_mib`` measures (see :func:`memory_probe`)
MEMORY_KINDS = {
    "cuda": "torch.cuda.max_memory_allocated over 2 steps after a warm-up step, above the memory allocated before them",
    "cpu": ("peak of the CPU allocator's running total (torch.profiler memory events) over 2 steps after a "
            "warm-up step, above the memory allocated before them (tensor memory, not the resident set)"),
}


# ------------------------------------------------------------------------------------------------
# the plain torch twin


def polyphase_select_plain(y: Tensor) -> Tensor:
    """Per-example adaptive polyphase selection of ``(B, C, H, W)`` written in plain torch."""
    b, c, h, w = y.shape
    y6 = y.reshape(b, c, h // 2, 2, w // 2, 2)
    with torch.no_grad():
        norms = y6.permute(0, 3, 5, 1, 2, 4).reshape(b, 4, -1).square().sum(-1)
        index = norms.argmax(1)
    return y6[torch.arange(b, device=y.device), :, :, index // 2, :, index % 2]


class TwinBlock(nn.Module):
    """One block of :class:`TwinNet`: ``ReLU((Σ pathways)/√K + b)`` with CONV (+ polyphase), F-FC, FC."""

    def __init__(self, spec: L.BlockSpec, kinds: Sequence[str], polyphase: bool = True) -> None:
        super().__init__()
        if spec.g_in != 1 or spec.g_out != 1 or not set(kinds) <= {"conv", "ffc", "fc"}:
            raise ValueError(f"the twin has CONV, F-FC and FC pathways on plain maps only, got {kinds}")
        self.spec, self.kinds, self.polyphase = spec, tuple(kinds), polyphase
        self.coef: dict[str, float] = {}  # parameter name -> prior precision of the raw parameter
        if "conv" in kinds:
            stride = 1 if polyphase else spec.stride
            self.conv = nn.Conv2d(spec.c_in, spec.c_out, 3, stride=stride, padding=1, padding_mode="circular", bias=False)
            self.coef["conv.weight"] = spec.c_in * 9 / 2.0  # w = θ·√(2/fan_in), δ = 1
        if "ffc" in kinds:
            k, c, p, q = spec.c_out, spec.c_in, spec.h_in * spec.w_in, spec.h_out * spec.w_out
            self.ffc_out = nn.Parameter(torch.randn(k, c, q) * math.sqrt(2.0 / c))
            self.ffc_in = nn.Parameter(torch.randn(k, c, p) / math.sqrt(p))
            self.coef["ffc_out"], self.coef["ffc_in"] = c / 2.0, float(p)
        if "fc" in kinds:
            self.fc = nn.Linear(spec.in_size, spec.out_size)
            self.coef["fc.weight"], self.coef["fc.bias"] = spec.in_size / 2.0, 1.0
        self.bias = nn.Parameter(torch.zeros(spec.c_out))
        self.coef["bias"] = 1.0

    def forward(self, x: Tensor) -> Tensor:
        s = self.spec
        total = None
        if "conv" in self.kinds:
            total = self.conv(x)
            if s.stride == 2 and self.polyphase:
                total = polyphase_select_plain(total)
        if "ffc" in self.kinds:
            z = torch.einsum("bcp,kcp->bkc", x.flatten(2), self.ffc_in)
            y = torch.einsum("bkc,kcq->bkq", z, self.ffc_out).reshape(x.shape[0], s.c_out, s.h_out, s.w_out)
            total = y if total is None else total + y
        if "fc" in self.kinds:
            y = self.fc(x.flatten(1)).reshape(x.shape[0], s.c_out, s.h_out, s.w_out)
            total = y if total is None else total + y
        assert total is not None
        if len(self.kinds) > 1:
            total = total / math.sqrt(len(self.kinds))
        return F.relu(total + self.bias[:, None, None])


class TwinNet(nn.Module):
    """Plain torch twin of a :class:`~pyro_invariance.models.layerwise.LayerwiseNet` with CONV / F-FC /
    FC pathways: the same blocks, strides, polyphase selection and head, raw (He-scaled) weights,
    and :meth:`loss` = (N/B)·cross-entropy + ½ Σ δ‖θ‖² (δ = 1; ``θ = w/gain``)."""

    def __init__(self, arch: Any, polyphase: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TwinBlock(spec, arch.kinds, polyphase) for spec in arch.blocks])
        self.head0 = nn.Linear(arch.head_in, arch.head_hidden)
        self.head1 = nn.Linear(arch.head_hidden, arch.num_classes)
        self.coef: dict[str, float] = {}
        for i, block in enumerate(self.blocks):
            self.coef.update({f"blocks.{i}.{k}": v for k, v in block.coef.items()})
        self.coef.update({"head0.weight": arch.head_in / 2.0, "head0.bias": 1.0,
                          "head1.weight": arch.head_hidden / 1.0, "head1.bias": 1.0})  # fmt: skip
        self._named = [(self.coef[n], p) for n, p in self.named_parameters()]

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for block in self.blocks:
            h = block(h)
        return self.head1(F.relu(self.head0(h.flatten(1))))

    def loss(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        nll = F.cross_entropy(self(x), y, reduction="sum") * (num_data / x.shape[0])
        prior = sum(0.5 * c * p.square().sum() for c, p in self._named)
        return nll + prior

    def gains(self) -> dict[str, float]:
        """``raw parameter = θ·gain`` for every parameter (θ the Pyro site's value)."""
        return {n: 1.0 / math.sqrt(c) if n.endswith(("weight", "ffc_out", "ffc_in")) else 1.0
                for n, c in self.coef.items()}  # fmt: skip

    def pyro_site(self, name: str) -> str:
        """The Pyro sample site of twin parameter ``name``."""
        return (name.replace("ffc_out", "ffc.weight_out").replace("ffc_in", "ffc.weight_in")
                .replace("head0", "head.0").replace("head1", "head.1"))  # fmt: skip

    @torch.no_grad()
    def load_sites(self, values: dict[str, Tensor]) -> None:
        """Set the raw parameters from Pyro site values θ (the MAP guide's median)."""
        gains = self.gains()
        for n, p in self.named_parameters():
            p.copy_(values[self.pyro_site(n)].reshape(p.shape) * gains[n])


# ------------------------------------------------------------------------------------------------
# the forward before issue 14 part 6 (for an interleaved before/after comparison)


def _old_circular_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    p = weight.shape[-1] // 2
    return F.conv2d(F.pad(x, (p, p, p, p), mode="circular"), weight, bias)


def _old_polyphase_select(x: Tensor) -> tuple[Tensor, Tensor]:
    comps = L.polyphase_components(x)
    norms = comps.reshape(comps.shape[0], 4, -1).square().sum(-1)
    index = norms.argmax(dim=1)
    return comps[torch.arange(x.shape[0], device=x.device), index], index


def _old_block_forward(self: L.RelaxedBlock, x: Tensor) -> Tensor:
    s = self.spec
    equivariant = [self.pathway(k)(x) for k in self.kinds if L.PATHWAYS[k].equivariant]
    others = [self.pathway(k)(x) for k in self.kinds if not L.PATHWAYS[k].equivariant]
    total = None
    if equivariant:
        total = torch.stack(equivariant).sum(0) if len(equivariant) > 1 else equivariant[0]
        if s.stride == 2:
            total, _ = _old_polyphase_select(total)
    for y in others:
        total = y if total is None else total + y
    assert total is not None
    total = total / math.sqrt(len(self.kinds)) + self.bias.reshape(1, -1, 1, 1, 1)
    return F.relu(total)


@contextlib.contextmanager
def before_forward() -> Iterator[None]:
    """Run the layer-wise blocks as before issue 14 part 6: each pathway's own forward (one
    convolution per equivariant pathway, ``F.pad``'s circular padding and backward), the stacked
    polyphase components, the sum divided by √K, the bias added last. (Not restored: the prior's
    ``loc``, now made on the device instead of from a Python 0.0 — no difference on CPU.)"""
    saved = L.RelaxedBlock.forward, L.circular_conv2d
    L.RelaxedBlock.forward, L.circular_conv2d = _old_block_forward, _old_circular_conv2d  # type: ignore[method-assign]
    try:
        yield
    finally:
        L.RelaxedBlock.forward, L.circular_conv2d = saved  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------------------
# steps


class _Cycler:
    """Minibatch indices like ``fit``'s shuffler: a seeded permutation, reshuffled after each pass."""

    def __init__(self, n: int, batch: int, seed: int, device: torch.device) -> None:
        self.n, self.batch, self.device = n, min(batch, n), device
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(n, generator=self.gen), 0

    def next(self) -> Tensor:
        if self.pos + self.batch > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.perm[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return idx.to(self.device)


def build_pyro(name: str, alpha: int, x_all: Tensor, y_all: Tensor, batch: int, seed: int,
               image_shape: Sequence[int] = IMAGE_SHAPE) -> tuple[Any, Any]:  # fmt: skip
    """A ``prior="fixed"`` network and its ``map`` guide (set up on a first batch), on ``x_all``'s device."""
    pyro.set_rng_seed(seed)
    model = MODELS.get(name, image_shape=tuple(image_shape), num_classes=NUM_CLASSES, alpha=alpha, prior="fixed")
    model.to(x_all.device)
    guide = guides.get("map", model)
    with poutine.block():
        guide(x_all[:batch], y_all[:batch], num_data=x_all.shape[0])
    guide.to(x_all.device)
    return model, guide


def make_pyro_step(model: Any, guide: Any, x_all: Tensor, y_all: Tensor, batch: int, total_steps: int, seed: int,
                   *, laplace: bool = False, validation: bool = True, before: bool = False) -> Callable[[], float]:  # fmt: skip
    """The loop body of ``fit`` (minus its history bookkeeping), optionally with the Laplace callback
    (and, ``before=True``, inside :func:`before_forward`)."""
    cfg = resolve_config(None, model, guide, {"steps": total_steps, "batch_size": batch, "seed": seed})
    optim = torch.optim.Adam(training._param_groups(model, guide, cfg))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    loss_fn = TraceMeanField_ELBO(num_particles=1, vectorize_particles=False)
    n = x_all.shape[0]
    batches = _Cycler(n, batch, seed, x_all.device)
    callbacks = [LaplaceEvidenceUpdate(x_all, y_all, every=LAPLACE_EVERY, warmup=0, batch_size=GGN_BATCH, seed=seed,
                                       curvature="diagonal", delta_update="mackay")] \
        if laplace else []  # fmt: skip
    counter = [0]

    def step() -> float:
        with before_forward() if before else contextlib.nullcontext():
            return body()

    def body() -> float:
        pyro.enable_validation(validation)
        idx = batches.next()
        x, y = x_all[idx], y_all[idx]
        loss = common.legacy_svi_step(loss_fn, model, guide, optim, sched, x, y, n)
        counter[0] += 1
        for callback in callbacks:
            callback(counter[0], model, guide)
        return -loss.item() / n

    return step


def make_lean_step(model: Any, guide: Any, x_all: Tensor, y_all: Tensor, batch: int, total_steps: int, seed: int,
                   *, compile: str = "off") -> Callable[[], Tensor]:  # fmt: skip
    """``fit``'s lean step (issue 14, ``pyro_invariance/infer/fast_step.py``): Pyro's validation off,
    the lean ELBO (no host reads), fused Adam, no finiteness check per step; with ``compile`` the
    loss captured on the first step and replayed (``"capture"``) or replayed as CUDA graphs
    (``"cudagraphs"``), as ``fit(compile=...)`` does."""
    cfg = resolve_config(None, model, guide, {"steps": total_steps, "batch_size": batch, "seed": seed})
    optim = make_optimizer(training._param_groups(model, guide, cfg))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    loss_fn = LeanTraceMeanField_ELBO(num_particles=1, vectorize_particles=False)
    n = x_all.shape[0]
    batches = _Cycler(n, batch, seed, x_all.device)
    captured: list[Any] = []

    def step() -> Tensor:
        pyro.enable_validation(False)
        idx = batches.next()
        x, y = x_all[idx], y_all[idx]
        optim.zero_grad(set_to_none=True)
        if compile != "off":
            if not captured:
                captured.append(CapturedLoss.capture(loss_fn, model, guide, x, y, {"num_data": n}, compile, x.device))
            loss = captured[0](x, y)
        else:
            loss = loss_fn.differentiable_loss(model, guide, x, y, num_data=n)
        loss.backward()
        optim.step()
        sched.step()
        return loss.detach()

    return step


def make_twin_step(twin: TwinNet, x_all: Tensor, y_all: Tensor, batch: int, total_steps: int,
                   seed: int) -> Callable[[], float]:  # fmt: skip
    optim = torch.optim.Adam(twin.parameters(), lr=TWIN_LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    n = x_all.shape[0]
    batches = _Cycler(n, batch, seed, x_all.device)

    def step() -> float:
        idx = batches.next()
        x, y = x_all[idx], y_all[idx]
        optim.zero_grad(set_to_none=True)
        loss = twin.loss(x, y, n)
        if not torch.isfinite(loss):
            raise FloatingPointError("non-finite loss")
        loss.backward()
        optim.step()
        sched.step()
        return -loss.item() / n

    return step


def check_twin(model: Any, guide: Any, twin: TwinNet, x: Tensor, y: Tensor, num_data: int) -> dict[str, float]:
    """Pyro's MAP loss and site gradients vs the twin's at the same point (the twin loaded from the guide).

    Pyro's loss carries the prior's normalisers Σ P·½ log(2π/δ), added to the twin's before comparing;
    gradients are compared per site as ``∂/∂θ = gain·∂/∂w``.
    """
    values = {k: v.detach() for k, v in guide.median().items()}
    twin.load_sites(values)
    pyro.enable_validation(True)
    guide.zero_grad(set_to_none=True)
    loss_p = TraceMeanField_ELBO().differentiable_loss(model, guide, x, y, num_data=num_data)
    loss_p.backward()
    twin.zero_grad(set_to_none=True)
    loss_t = twin.loss(x, y, num_data)
    loss_t.backward()
    const = sum(v.numel() for v in values.values()) * 0.5 * math.log(2 * math.pi)  # δ = 1
    grads_p = {n.removesuffix("_unconstrained"): p.grad for n, p in guide.named_parameters()}
    gains = twin.gains()
    worst, worst_name = 0.0, ""
    for n, p in twin.named_parameters():
        site = twin.pyro_site(n)
        gp = grads_p[site].reshape(p.shape)
        gt = p.grad * gains[n]
        rel = float((gp - gt).norm() / gp.norm().clamp_min(1e-30))
        if rel > worst:
            worst, worst_name = rel, site
    lp, lt = float(loss_p.detach()), float(loss_t.detach()) + const
    guide.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    return {"loss_pyro": lp, "loss_twin_plus_const": lt, "loss_rel_diff": abs(lp - lt) / abs(lp),
            "max_grad_rel_diff": worst, "max_grad_rel_diff_site": worst_name}  # fmt: skip


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------------------------
# measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(ts: Sequence[float]) -> dict[str, float]:
    ts = list(ts)
    q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) >= 2 else [ts[0]] * 3
    return {"median": statistics.median(ts), "q1": q[0], "q3": q[2], "min": min(ts), "n": len(ts)}


def _steppers(name: str, alpha: int, variants: Sequence[str], x_all: Tensor, y_all: Tensor, batch: int,
              total_steps: int, seed: int, image_shape: Sequence[int]) -> tuple[dict[str, Callable[[], float]], dict[str, Any]]:  # fmt: skip
    """Independent model/guide/twin copies, one per variant (same seed, same starting point)."""
    steppers: dict[str, Callable[[], float]] = {}
    info: dict[str, Any] = {}
    for v in variants:
        if v.startswith("fit-"):
            model, guide = build_pyro(name, alpha, x_all, y_all, batch, seed, image_shape)
            mode = {"fit-lean": "off", "fit-capture": "capture", "fit-cudagraphs": "cudagraphs"}[v]
            steppers[v] = make_lean_step(model, guide, x_all, y_all, batch, total_steps, seed, compile=mode)
        elif v.startswith("pyro"):
            model, guide = build_pyro(name, alpha, x_all, y_all, batch, seed, image_shape)
            info.setdefault("params", model.num_parameters())
            steppers[v] = make_pyro_step(model, guide, x_all, y_all, batch, total_steps, seed,
                                         laplace=v.startswith("pyro-map+laplace"), validation=v != "pyro-map-noval",
                                         before=v.endswith("-before"))  # fmt: skip
        else:
            model, guide = build_pyro(name, alpha, x_all, y_all, batch, seed, image_shape)
            twin = TwinNet(model.arch, polyphase=v == "twin").to(x_all.device)
            twin.load_sites({k: t.detach() for k, t in guide.median().items()})
            if v == "twin":
                n_b = min(batch, x_all.shape[0])
                info["check"] = check_twin(model, guide, twin, x_all[:n_b], y_all[:n_b], x_all.shape[0])
                info["twin_params"] = _param_count(twin)
            steppers[v] = make_twin_step(twin, x_all, y_all, batch, total_steps, seed)
    return steppers, info


def _data(alpha: int, batch: int, train_size: int | None, seed: int, device: torch.device,
          image_shape: Sequence[int]) -> tuple[Tensor, Tensor]:  # fmt: skip
    n = int(train_size or 2 * batch)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *image_shape, generator=gen)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    return x.to(device), y.to(device)


def memory_probe(factory: Callable[[], Callable[[], float]], device: torch.device) -> float:
    """Peak memory of a training step in MiB: one warm-up step (optimiser state), then the peak of
    the memory allocated during two steps above what was allocated before them.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the running total of the CPU allocator's
    allocations and frees recorded by ``torch.profiler(profile_memory=True)`` (tensor memory only;
    the resident set is no measure of it: the allocator keeps freed memory, and a child process's
    ``ru_maxrss`` starts at its parent's resident set).
    """
    step = factory()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(2):
            step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            step()
    events = sorted((e for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
                     if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")),
                    key=lambda e: e.start_ns())  # fmt: skip
    total = peak = 0
    for e in events:
        total += e.nbytes()
        peak = max(peak, total)
    return peak / 2**20


@pyro_scope()
def measure_layerwise(
    device: str,
    alpha: int,
    steps: int,
    warmup: int,
    batch: int = 128,
    *,
    models: Sequence[str] = MODEL_NAMES,
    variants: Sequence[str] = VARIANTS,
    train_size: int | None = None,
    image_shape: Sequence[int] = IMAGE_SHAPE,
    seed: int = 0,
    memory: bool = True,
    profile: bool = False,
    profile_steps: int = 2,
    log: Callable[[str], None] = common.log,
) -> list[dict[str, Any]]:
    """Time the layer-wise MAP step, the MAP step with Laplace updates and the plain torch twin.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:0"``...).
        alpha: network width α (the paper: 10).
        steps: timed steps per variant (rounded up to a multiple of ``LAPLACE_EVERY`` = 10).
        warmup: untimed steps per variant first (rounded up likewise; 0 allowed).
        batch: minibatch size.
        models: catalogue names (``layerwise-*`` with CONV / F-FC / FC pathways for the twin).
        variants: from :data:`VARIANTS` and :data:`EXTRA_VARIANTS`.
        train_size: training-set size N (default ``2·batch``): the likelihood scale N/B and the data
            of the Laplace curvature.
        memory: measure peak memory (CUDA: allocator peak; CPU: fresh-process RSS rise).
        profile: also run torch.profiler over ``profile_steps`` steps of each variant (rows get
            ``profile``: top aten ops by self time).

    Returns:
        One row per (model, variant): ``model``, ``variant``, ``device``, ``alpha``, ``batch``,
        ``train_size``, ``params``, ``ms_per_step`` (amortised over chunks: median), ``ms_q1``,
        ``ms_q3`` (IQR over chunks), ``step_ms_median``, ``step_ms_q1``, ``step_ms_q3`` (single
        steps), ``ratio_to_twin`` (ratio of the amortised medians), ``paired_ratio_to_twin``
        (median over repetitions of chunk / twin chunk), ``peak_mem_mib``, ``peak_mem_kind``,
        ``steps``, ``chunks``, and for the twin row ``check`` (loss / gradient agreement with Pyro).
    """
    unknown = [v for v in variants if v not in VARIANTS + EXTRA_VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; use {VARIANTS + EXTRA_VARIANTS}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    chunk = LAPLACE_EVERY
    n_chunks, w_chunks = max(1, math.ceil(steps / chunk)), math.ceil(max(0, warmup) / chunk)
    total_steps = (n_chunks + w_chunks) * chunk + 10 * chunk
    rows: list[dict[str, Any]] = []
    x_all, y_all = _data(alpha, batch, train_size, seed, dev, image_shape)
    n = x_all.shape[0]
    for name in models:
        log(f"{name}: α={alpha}, batch {batch}, N={n}, {device}; building {list(variants)}")
        steppers, info = _steppers(name, alpha, variants, x_all, y_all, batch, total_steps, seed, image_shape)
        if "check" in info:
            log(f"{name}: twin check {info['check']}")
        names = list(steppers)
        chunk_times: dict[str, list[float]] = {v: [] for v in names}
        step_times: dict[str, list[float]] = {v: [] for v in names}
        t_start = time.perf_counter()
        for rep in range(w_chunks + n_chunks):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for v in order:
                ts = []
                _sync(dev)
                for _ in range(chunk):
                    t0 = time.perf_counter()
                    steppers[v]()
                    _sync(dev)
                    ts.append(time.perf_counter() - t0)
                if rep >= w_chunks:
                    chunk_times[v].append(sum(ts) / chunk)
                    step_times[v].extend(ts)
        log(f"{name}: timed {n_chunks} chunk(s) of {chunk} steps per variant in {time.perf_counter() - t_start:.0f} s")
        profiles: dict[str, Any] = {}
        if profile:
            for v in names:
                if v in ("pyro-map", "twin", "pyro-map-noval", "pyro-map-before"):
                    profiles[v] = profile_step(steppers[v], profile_steps)
        del steppers
        twin_chunks = chunk_times.get("twin")
        for v in names:
            ch, st = _summary(chunk_times[v]), _summary(step_times[v])
            row: dict[str, Any] = {
                "model": name, "variant": v, "device": str(dev), "alpha": alpha, "batch": batch, "train_size": n,
                "params": info.get("params"), "ms_per_step": ch["median"] * 1e3, "ms_q1": ch["q1"] * 1e3,
                "ms_q3": ch["q3"] * 1e3, "step_ms_median": st["median"] * 1e3, "step_ms_q1": st["q1"] * 1e3,
                "step_ms_q3": st["q3"] * 1e3, "steps": len(step_times[v]), "chunks": len(chunk_times[v]),
            }  # fmt: skip
            if twin_chunks:
                row["ratio_to_twin"] = ch["median"] / statistics.median(twin_chunks)
                row["paired_ratio_to_twin"] = statistics.median(a / b for a, b in zip(chunk_times[v], twin_chunks))
            if v == "twin":
                row["check"] = info["check"]
                row["twin_params"] = info["twin_params"]
            if v in profiles:
                row["profile"] = profiles[v]
            rows.append(row)
            log(f"{name} {v}: {row['ms_per_step']:.1f} ms/step (IQR {row['ms_q1']:.1f}–{row['ms_q3']:.1f}), "
                f"× twin {row.get('ratio_to_twin', float('nan')):.2f}")  # fmt: skip
        if memory:
            for row in rows[-len(names):]:
                v = row["variant"]

                def factory(v: str = v) -> Callable[[], float]:
                    global LAPLACE_EVERY
                    saved, LAPLACE_EVERY = LAPLACE_EVERY, 1  # the Laplace variants update at every probe step
                    try:
                        return _steppers(name, alpha, [v], x_all, y_all, batch, 100, seed, image_shape)[0][v]
                    finally:
                        LAPLACE_EVERY = saved

                row["peak_mem_mib"] = memory_probe(factory, dev)
                row["peak_mem_kind"] = MEMORY_KINDS[dev.type]
                log(f"{name} {v}: peak memory of a step {row['peak_mem_mib']:.1f} MiB")
    return rows


def profile_step(step: Callable[[], float], reps: int, row_limit: int = 15) -> dict[str, Any]:
    """torch.profiler (CPU activity) over ``reps`` steps: top aten ops by self CPU time, the number
    of aten calls and the share of wall time inside aten ops."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        wall = (time.perf_counter() - t0) / reps
    events = prof.key_averages()
    aten = [e for e in events if e.key.startswith("aten::")]
    top = sorted(aten, key=lambda e: e.self_cpu_time_total, reverse=True)[:row_limit]
    return {
        "wall_ms_per_step": wall * 1e3,
        "aten_self_ms_per_step": sum(e.self_cpu_time_total for e in aten) / 1e3 / reps,
        "aten_calls_per_step": sum(e.count for e in aten) / reps,
        "top": [{"op": e.key, "calls_per_step": e.count / reps, "self_ms_per_step": e.self_cpu_time_total / 1e3 / reps}
                for e in top],  # fmt: skip
    }


# ------------------------------------------------------------------------------------------------
# CLI


def _fmt_mem(r: dict[str, Any]) -> str:
    return "" if r.get("peak_mem_mib") is None else f"{r['peak_mem_mib']:.0f}"


def _config(r: dict[str, Any]) -> str:
    return f"α={r['alpha']}, B={r['batch']}"


#: What issue 14 part 6 changed in the forward path (the "before" rows of a comparison ran without it).
CHANGES = """\
Changes to the layer-wise forward path (`pyro_invariance/symmetry/equivariant_layers.py`; the model's
numbers are unchanged up to float rounding, checked against the direct formula kept in
`tests/layerwise_reference.py` by `tests/test_equivariant_layers.py` and `tests/test_layerwise_models.py`):

- **polyphase stride 2**: the chosen component is gathered straight from the stride-1 map (one
  indexing op, one scatter in the backward) instead of stacking all four components (a copy of the
  map, four slice backward passes with full-size zero tensors); the norms are computed outside
  autograd on a component-major copy, summed in the same order as before, so the choice is
  bit-identical.
- **circular padding**: `F.pad(mode="circular")` forward with a hand-written backward (interior of
  the padded gradient plus the wrapped borders: two copies and four slice additions instead of
  about thirty kernels; bit-identical on CPU).
- **pathway sums**: all equivariant pathways of a block (CONV, S-CONV, GCONV) are 3×3 circular
  convolutions of the same input, so their filters are summed and convolved once (one padding, one
  convolution); the 1/√K of the sum is folded into the small filters, the F-FC/S-FC output factor
  θ₁ and the FC input instead of dividing the activations; at stride 1 the block bias is the
  convolution's bias (at stride 2 it still follows the polyphase choice).
- **prior sites**: the prior's loc is made on the scale's device (`scale.new_zeros(())`) instead of
  a Python `0.0`, which `torch.distributions` turned into a host-to-device copy (a stream
  synchronisation on CUDA) at every weight site of every step. Sites, their order and the
  log-densities are unchanged (batching the prior log-probs is Pyro's business).
"""


def _find(rows: list[dict[str, Any]], like: dict[str, Any], variant: str) -> dict[str, Any] | None:
    key = (like["alpha"], like["batch"], like["model"])
    return next((r for r in rows if (r["alpha"], r["batch"], r["model"]) == key and r["variant"] == variant), None)


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if r is None or "paired_ratio_to_twin" not in r else f"{r['paired_ratio_to_twin']:.2f}×"


def _summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per size and model: Pyro MAP / twin now, before, without validation, with Laplace."""
    lines = []
    for r in rows:
        if r["variant"] != "pyro-map" or "paired_ratio_to_twin" not in r:
            continue
        text = f"- {_config(r)}, `{r['model']}`: Pyro MAP / twin **{_ratio(r)}** (paired)"
        for variant, label in (("pyro-map-before", "before"), ("pyro-map-noval", "without Pyro's validation"),
                               ("pyro-map+laplace", "with Laplace updates"),
                               ("pyro-map+laplace-before", "with Laplace updates before")):  # fmt: skip
            other = _find(rows, r, variant)
            if other is not None:
                text += f"; {label} {_ratio(other)}"
        lines.append(text + ".")
    return lines


def render(rows: list[dict[str, Any]], info: dict[str, Any], settings: dict[str, Any],
           command: str | None = None) -> str:  # fmt: skip
    intro = "\n\n".join((__doc__ or "").split("\n\n")[1:3])  # the variants' list is the second paragraph
    out = [common.header_markdown("Layer-wise networks: time per training step vs a plain torch twin", info, settings,
                                  command or common.command_line(), intro)]  # fmt: skip
    out += [CHANGES, "## Summary", "", "Paired ratio: each 10-step chunk over the twin's chunk of the same "
            "repetition (adjacent in time), median over repetitions.", "", *_summary_lines(rows), ""]  # fmt: skip
    table = []
    for r in rows:
        table.append([_config(r), f"`{r['model']}`", f"`{r['variant']}`", f"{r['params']:,}", f"{r['ms_per_step']:.1f}",
                      f"{r['ms_q1']:.1f}–{r['ms_q3']:.1f}", f"{r['step_ms_median']:.1f}",
                      f"{r['step_ms_q1']:.1f}–{r['step_ms_q3']:.1f}", f"{r.get('ratio_to_twin', float('nan')):.2f}×",
                      _ratio(r), _fmt_mem(r)])  # fmt: skip
    out += ["## Time per step", "",
            common.md_table(["size", "model", "variant", "params", "ms/step (amortised, median)", "IQR over chunks",
                             "single step median", "single step IQR", "× twin (medians)", "paired × twin",
                             "peak mem (MiB)"], table), "",
            f"Peak memory: {rows[0].get('peak_mem_kind', 'not measured')}.", ""]  # fmt: skip
    comp = []
    for r in rows:
        if r["variant"] not in ("pyro-map", "pyro-map+laplace"):
            continue
        b = _find(rows, r, r["variant"] + "-before")
        if b is None:
            continue
        comp.append([_config(r), f"`{r['model']}`", f"`{r['variant']}`", f"{b['ms_per_step']:.1f} → {r['ms_per_step']:.1f}",
                     f"{b['ms_per_step'] / r['ms_per_step']:.2f}×", f"{_ratio(b)} → {_ratio(r)}",
                     f"{_fmt_mem(b)} → {_fmt_mem(r)}", _fmt_mem(_find(rows, r, "twin") or {})])  # fmt: skip
    if comp:
        out += ["## Before / after (same run, interleaved)", "",
                common.md_table(["size", "model", "variant", "ms/step before → after", "speed-up",
                                 "paired × twin before → after", "peak mem MiB before → after", "twin peak mem MiB"],
                                comp), ""]  # fmt: skip
    checks = [r for r in rows if r["variant"] == "twin"]
    if checks:
        out += ["## Twin check", "", "The twin loaded with the Pyro MAP point, one minibatch, before timing:", "",
                common.md_table(["size", "model", "twin params", "Pyro loss", "twin loss + normaliser", "rel. diff",
                                 "max rel. grad diff (site)"],
                                [[_config(r), f"`{r['model']}`", f"{r['twin_params']:,}", f"{r['check']['loss_pyro']:.6g}",
                                  f"{r['check']['loss_twin_plus_const']:.6g}", f"{r['check']['loss_rel_diff']:.1e}",
                                  f"{r['check']['max_grad_rel_diff']:.1e} ({r['check']['max_grad_rel_diff_site']})"]
                                 for r in checks]), ""]  # fmt: skip
    profiled = [r for r in rows if "profile" in r]
    if profiled:
        out += ["## Profile (torch.profiler, CPU activity, top aten ops by self time)", ""]
    for r in profiled:
        p = r["profile"]
        out += [f"{_config(r)} `{r['model']}` `{r['variant']}`: {p['wall_ms_per_step']:.1f} ms/step under the "
                f"profiler, {p['aten_calls_per_step']:.0f} aten calls/step, {p['aten_self_ms_per_step']:.1f} ms/step "
                "inside aten ops.", "",
                common.md_table(["op", "calls/step", "self ms/step"],
                                [[f"`{t['op']}`", f"{t['calls_per_step']:.0f}", f"{t['self_ms_per_step']:.2f}"]
                                 for t in p["top"]]), ""]  # fmt: skip
    return "\n".join(out)


def _parse_configs(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        a, _, b = part.strip().partition("x")
        out.append((int(a), int(b)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--alpha", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--configs", default=None,
                        help="several sizes, 'ALPHAxBATCH,...' (e.g. 10x128,10x32,2x128); overrides --alpha/--batch")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant (multiple of 10)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per variant (multiple of 10)")
    parser.add_argument("--train-size", type=int, default=None, help="training-set size N (default 2·batch)")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", default="", metavar="SIZES",
                        help="torch.profiler tables of pyro-map and twin at these sizes ('ALPHAxBATCH,...'; 'all')")
    parser.add_argument("--stem", default="layerwise_step_time", help="results file stem")
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    info = common.machine_info()
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    configs = _parse_configs(args.configs) if args.configs else [(args.alpha, args.batch)]
    profiled = configs if args.profile == "all" else _parse_configs(args.profile) if args.profile else []
    rows: list[dict[str, Any]] = []
    for alpha, batch in configs:
        rows += measure_layerwise(args.device, alpha, args.steps, args.warmup, batch, models=models,
                                  variants=variants, train_size=args.train_size, seed=args.seed,
                                  memory=not args.no_memory, profile=(alpha, batch) in profiled)  # fmt: skip
    settings = {"device": args.device, "sizes (α, batch)": configs, "input": "×".join(map(str, IMAGE_SHAPE)),
                "classes": NUM_CLASSES, "train_size N": "2·batch" if args.train_size is None else args.train_size,
                "timed steps / warm-up steps per variant": f"{rows[0]['steps']} / {args.warmup}",
                "Laplace update every": LAPLACE_EVERY, "GGN minibatch": GGN_BATCH,
                "pyro validation": "on (pyro-map, pyro-map+laplace)", "threads": args.threads}  # fmt: skip
    payload = {"machine": info, "settings": settings, "command": common.command_line(), "rows": rows}
    md, js = common.write_results(args.stem, render(rows, info, settings), payload, args.out_dir)
    common.log(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
