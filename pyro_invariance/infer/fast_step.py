"""The pieces of ``fit``'s lean training step: an ELBO without host synchronisation,
Pyro's validation switched per step and restored afterwards, a fused optimiser, TF32 on request,
and the ``compile`` option, which captures the loss as one graph of tensor operations.

**Lean ELBOs.** Pyro 1.9's ``Trace_ELBO.differentiable_loss`` (which ``TraceMeanField_ELBO``
inherits) reads the loss back to the host on every call (``torch_item`` of each particle and of the
surrogate loss) and registers a NaN check on the gradient (``warn_if_nan``): three to four host
synchronisations per step, which on a GPU stall the queue. :class:`LeanTraceMeanField_ELBO` and
:class:`LeanTrace_ELBO` compute the same surrogate loss from the same traces without reading it back
(``fit`` checks finiteness itself, in bulk). For one particle and ``TraceMeanField_ELBO`` the loss
and its gradients are bit-identical to Pyro's; with several particles, or ``Trace_ELBO``, Pyro's
returned value is rounded through Python floats while these stay in the tensor's dtype (the
gradients are the same). Everything else (traces, validation checks when enabled, analytic KLs,
vectorised particles) is Pyro's own code.

**Capture** (``FitConfig(compile="capture")``): :class:`CapturedLoss` runs the ELBO once under
``torch.fx.experimental.proxy_tensor.make_fx`` with the model's and the guide's parameters and
buffers and the minibatch as inputs, which records the tensor operations of the whole Pyro program
(guide, model, log-densities, KLs; random draws included, as operations) into one graph. Replaying
the graph skips Pyro's Python machinery (messengers, distribution objects, trace bookkeeping) and
computes the same numbers from the same random streams: before it is used, the captured loss and
its gradients are compared with the eager ELBO's from the same RNG state and must agree (bit-for-bit
on CPU) and consume the RNGs alike. Tracing bakes Python-level decisions into the graph, so a model
whose Python control flow depends on tensor *values* that change during training would be replayed
wrongly; such models either fail to trace (reading a value raises, then ``fit`` warns and runs
eagerly) or are caught by the comparison when the decision differs on the captured step. State
that a callback changes must be tensors (buffers, parameters), as for checkpoints.

**Inductor** (``compile="inductor"``, or ``compile=True``): the captured graph is compiled with
``torch.compile`` (Inductor; on CUDA ``mode="reduce-overhead"``, i.e. CUDA graphs, as the shapes are
static). Inductor draws its random numbers with its own generator (seeded from torch's), so the run
is the same estimator with other draws: not bit-identical to ``compile="off"``. Compilation takes
from seconds to minutes on the first step; if it fails, ``fit`` warns and replays the captured graph.

**CUDA graphs** (``compile="cudagraphs"``, CUDA only): the captured graph's forward and backward are
recorded as CUDA graphs by :func:`torch.cuda.make_graphed_callables` and replayed on each step, so
a step launches a handful of graphs instead of hundreds of kernels from Python (the optimiser step
stays eager: fused Adam). The parameters are the graphs' own static inputs (updated in place by the
optimiser, never copied); the minibatch is copied into static buffers; the graph's constants and
factory calls are first moved to the device and ``matrix_exp`` (which reads norms on the host) is
replaced by :func:`static_matrix_exp` (:func:`graph_on_device`). Random draws inside a CUDA
graph come from the CUDA generator's graph-safe Philox offsets: the same estimator with other draws
(not bit-identical to ``"off"``). Elsewhere it is ``"capture"`` with a warning. If recording or a
replay fails, ``fit`` warns and replays the captured graph eagerly (the RNG state as before the call).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyro
import pyro.distributions.util as _dist_util
import pyro.infer.util as _infer_util
import pyro.poutine.util as _poutine_util
import torch
from pyro import poutine
from pyro.distributions.util import is_identically_zero, scale_and_mask
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.enum import get_importance_trace
from pyro.infer.trace_elbo import _compute_log_r
from pyro.infer.util import check_fully_reparametrized, get_dependent_plate_dims, is_validation_enabled, torch_sum
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch import Tensor, nn
from torch.distributions import Distribution, kl_divergence

from pyro_invariance.infer.checkpoint import rng_state, set_rng_state
from pyro_invariance.validation import check_positive_int, warn_user

__all__ = [
    "CapturedLoss",
    "CaptureError",
    "LEAN_ELBOS",
    "graph_on_device",
    "host_traffic",
    "static_matrix_exp",
    "LeanIWAE_ELBO",
    "LeanRWS_ELBO",
    "LeanTraceMeanField_ELBO",
    "LeanTrace_ELBO",
    "make_optimizer",
    "preserved_validation",
    "register_elbo",
    "set_validation",
    "tf32_matmuls",
    "torch_threads",
]

# ----------------------------------------------------------------------------------------------
# ELBOs without host synchronisation
# ----------------------------------------------------------------------------------------------


class _ForModel:
    """``for_model(model, **options)``: the loss for ``model`` (``fit`` builds every lean ELBO so); the
    options are Pyro's ``ELBO`` ones. A loss that reads the model (e.g. its symmetry sites) overrides it."""

    @classmethod
    def for_model(cls, model: Any, **options: Any) -> Any:
        return cls(**options)


def _average(elbo: Any, particles: Iterator[Tensor]) -> Tensor:
    """Σ_p loss_p / P in Pyro's order of operations (no division for one particle: x / 1 == x)."""
    total: Tensor | None = None
    for loss in particles:
        if elbo.num_particles != 1:
            loss = loss / elbo.num_particles
        total = loss if total is None else total + loss
    assert total is not None
    return total


def _log_prob_sum(site: dict[str, Any]) -> Tensor:
    """``site["log_prob_sum"]``, computed as ``Trace.compute_log_prob`` does where it is missing."""
    if "log_prob_sum" not in site:
        log_p = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
        site["unscaled_log_prob"] = log_p
        site["log_prob"] = log_p = scale_and_mask(log_p, site["scale"], site["mask"])
        site["log_prob_sum"] = log_p.sum()
    return site["log_prob_sum"]


def _entropy_term(site: dict[str, Any]) -> Tensor:
    """``site["score_parts"].entropy_term``, computed as ``Trace.compute_score_parts`` does where missing."""
    if "score_parts" not in site:
        parts = site["fn"].score_parts(site["value"], *site["args"], **site["kwargs"])
        site["unscaled_log_prob"] = parts.log_prob
        site["score_parts"] = parts = parts.scale_and_mask(site["scale"], site["mask"])
        site["log_prob"] = parts.log_prob
        site["log_prob_sum"] = parts.log_prob.sum()
    return site["score_parts"].entropy_term


class LeanTraceMeanField_ELBO(_ForModel, TraceMeanField_ELBO):
    """``TraceMeanField_ELBO`` whose ``differentiable_loss`` never reads the loss back to the host
    (module docstring); analytic KL where registered, as Pyro's.

    With Pyro's validation off it also skips what the loss does not use: the traces are not copied
    to drop subsample sites, and a log-density is computed only where it enters the loss (observed
    sites; latent sites without an analytic KL), not for every site of both traces. The numbers are
    the same (the same operations on the same values); with validation on, Pyro's own
    ``get_importance_trace`` and its checks run."""

    def _get_trace(self, model: Any, guide: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        if is_validation_enabled() or isinstance(poutine.unwrap(guide), Messenger):
            return super()._get_trace(model, guide, args, kwargs)
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        return model_trace, guide_trace

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        traces = self._get_traces(model, guide, args, kwargs)
        return _average(self, (self._surrogate(m, g) for m, g in traces))

    def _surrogate(self, model_trace: Any, guide_trace: Any) -> Tensor:
        """Pyro 1.9's ``_differentiable_loss_particle`` minus its ``torch_item``."""
        elbo: Any = 0
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample" or site_is_subsample(model_site):
                continue
            if model_site["is_observed"]:
                elbo = elbo + _log_prob_sum(model_site)
                continue
            guide_site = guide_trace.nodes[name]
            if is_validation_enabled():
                check_fully_reparametrized(guide_site)
            try:
                kl = kl_divergence(guide_site["fn"], model_site["fn"])
            except NotImplementedError:  # no analytic KL: sample it
                elbo = elbo + _log_prob_sum(model_site) - _entropy_term(guide_site).sum()
                continue
            kl = scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])
            if torch.is_tensor(kl):
                elbo = elbo - kl.sum()
            else:
                elbo = elbo - kl * torch.Size(guide_site["fn"].batch_shape).numel()
        for name, guide_site in guide_trace.nodes.items():  # auxiliary guide sites
            if guide_site["type"] == "sample" and name not in model_trace.nodes and not site_is_subsample(guide_site):
                assert guide_site["infer"].get("is_auxiliary")
                if is_validation_enabled():
                    check_fully_reparametrized(guide_site)
                elbo = elbo - _entropy_term(guide_site).sum()
        return -elbo


class LeanTrace_ELBO(_ForModel, Trace_ELBO):
    """``Trace_ELBO`` whose ``differentiable_loss`` never reads the loss back to the host: the value
    is the ELBO estimate (in the tensors' dtype), the gradient the surrogate's, as Pyro's."""

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        traces = self._get_traces(model, guide, args, kwargs)
        return _average(self, (self._surrogate(m, g) for m, g in traces))

    def _surrogate(self, model_trace: Any, guide_trace: Any) -> Tensor:
        """Pyro 1.9's ``_differentiable_loss_particle`` with the ELBO kept as a tensor."""
        elbo: Any = 0
        surrogate: Any = 0
        log_r = None
        exact = True  # surrogate == elbo in value (every guide site reparameterised)
        for site in model_trace.nodes.values():
            if site["type"] == "sample":
                elbo = elbo + site["log_prob_sum"]
                surrogate = surrogate + site["log_prob_sum"]
        for site in guide_trace.nodes.values():
            if site["type"] != "sample":
                continue
            log_prob, score_function_term, entropy_term = site["score_parts"]
            elbo = elbo - site["log_prob_sum"]
            if not is_identically_zero(entropy_term):
                surrogate = surrogate - entropy_term.sum()
            if is_identically_zero(entropy_term) or entropy_term is not log_prob:
                exact = False
            if not is_identically_zero(score_function_term):
                exact = False
                if log_r is None:
                    log_r = _compute_log_r(model_trace, guide_trace)
                term = log_r.sum_to(site["cond_indep_stack"])
                surrogate = surrogate + (term * score_function_term).sum()
        if exact:
            return -surrogate
        value = elbo.detach() if torch.is_tensor(elbo) else torch.as_tensor(elbo)
        return -(value + (surrogate - surrogate.detach()))


def _log_density(trace: Any, sum_dims: Any) -> Tensor:
    """Σ of a trace's sample-site log-densities, summed over every dimension but the particles'."""
    total: Any = 0
    for site in trace.nodes.values():
        if site["type"] == "sample":
            total = total + torch_sum(site["log_prob"], sum_dims)
    return total


def _particles(elbo: Trace_ELBO, values: list[Tensor]) -> Tensor:
    """The per-particle values of ``_get_traces`` as one tensor with the particles first."""
    return values[0] if elbo.vectorize_particles and elbo.num_particles > 1 else torch.stack(values)


class LeanIWAE_ELBO(_ForModel, Trace_ELBO):
    """The importance-weighted bound (Burda et al. 2016, Eq. 8; Pyro's ``RenyiELBO`` at α = 0) as a
    differentiable loss, without host reads::

        loss = −log (1/K) Σ_k p(D, z_k) / q(z_k),   z_k ~ q,  K = num_particles,

    with the weights' log-densities summed over the data plate as ``RenyiELBO`` does (a minibatch's
    likelihood scaled by N/B: with minibatches the bound is that of the rescaled likelihood). Its
    gradient is ``RenyiELBO``'s at α = 0 (the normalised weights times the reparameterised log-weight
    gradients), so every guide site must be reparameterised. Trained on it, a guide is pulled towards
    covering the posterior (the bound tightens as q approaches the posterior in a mass-covering
    sense); K = 1 is the ELBO."""

    def log_weights(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        """The ``num_particles`` importance log-weights ``log p(D, z_k) − log q(z_k)``, particles first
        (``(K,)``, or ``(K, …)`` where the model's log-density keeps further dimensions)."""
        weights = []
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            for name, site in guide_trace.nodes.items():
                if site["type"] == "sample" and not is_identically_zero(site["score_parts"].score_function):
                    raise ValueError(f"elbo='iwae' needs reparameterised guide sites; {name!r} is not")
            sum_dims = get_dependent_plate_dims(model_trace.nodes.values())
            weights.append(_log_density(model_trace, sum_dims) - _log_density(guide_trace, sum_dims))
        return _particles(self, weights)

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        log_w = self.log_weights(model, guide, *args, **kwargs)
        return -(torch.logsumexp(log_w, dim=0) - math.log(self.num_particles)).sum()


class LeanRWS_ELBO(_ForModel, Trace_ELBO):
    """Reweighted wake-sleep in its wake phases (Bornschein & Bengio 2015; Le et al. 2019, "Revisiting
    Reweighted Wake-Sleep", Eqs. 4-5; Pyro's ``ReweightedWakeSleep(insomnia=1)``) as one differentiable
    loss without host reads. With ``z_k ~ q_φ`` drawn *without* a reparameterised path, K = num_particles
    and the self-normalised weights ``w̄_k = softmax_k(log p_θ(D, z_k) − log q_φ(z_k))``::

        model parameters θ (wake-θ):  ∇_θ loss = −Σ_k w̄_k ∇_θ log p_θ(D, z_k)   (the IWAE bound's, in θ)
        guide parameters φ (wake-φ):  ∇_φ loss = −Σ_k w̄_k ∇_φ log q_φ(z_k)     (≈ ∇_φ KL(p ‖ q_φ))

    and the value is the negative IWAE bound, ``−log (1/K) Σ_k exp(log p − log q)``. The guide thus
    follows the *inclusive* KL(p ‖ q), which covers the posterior's mass: for a Gaussian guide its
    K → ∞ fixed point matches the posterior's mean and covariance (moment matching), where the ELBO's
    exclusive KL(q ‖ p) shrinks the guide inside a heavy-tailed posterior. For finite K the
    self-normalised weights are biased towards q, so a guide that starts far too narrow widens only
    partly; start it from an ELBO fit (``warm_start``). No guide site needs to be reparameterised."""

    def _get_trace(self, model: Any, guide: Any, args: Any, kwargs: Any) -> Any:
        # the guide's draws are detached: no gradient flows through them into φ
        return get_importance_trace("flat", self.max_plate_nesting, model, guide, args, kwargs, detach=True)

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        log_ps, log_qs = [], []
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            sum_dims = get_dependent_plate_dims(model_trace.nodes.values())
            log_ps.append(_log_density(model_trace, sum_dims))
            log_qs.append(_log_density(guide_trace, sum_dims))
        log_p, log_q = _particles(self, log_ps), _particles(self, log_qs)
        log_w = log_p - log_q.detach()
        log_sum = torch.logsumexp(log_w, dim=0)
        theta_loss = -(log_sum - math.log(self.num_particles)).sum()
        phi_loss = -((log_w - log_sum).exp().detach() * log_q).sum()
        return theta_loss + (phi_loss - phi_loss.detach())  # value: −IWAE; gradient: wake-θ + wake-φ


#: The losses ``fit`` builds by name (``FitConfig.elbo``); :func:`register_elbo` adds others.
LEAN_ELBOS: dict[str, type] = {
    "meanfield": LeanTraceMeanField_ELBO,
    "trace": LeanTrace_ELBO,
    "iwae": LeanIWAE_ELBO,
    "rws": LeanRWS_ELBO,
}


def register_elbo(name: str, loss: type) -> type:
    """Make ``fit(..., elbo=name)`` train on ``loss``: a Pyro ``ELBO`` class with a classmethod
    ``for_model(model, **options)`` that builds it for a model (as the lean ELBOs here do; ``options``
    are Pyro's ``ELBO`` ones). A ``loss`` with a method ``check_guide(guide, x, y, **kwargs)`` has it
    called once before the first step, to refuse a guide it cannot train. Returns ``loss``.

    Raises:
        ValueError: ``name`` is already taken by another loss.
    """
    if LEAN_ELBOS.get(name, loss) is not loss:
        raise ValueError(f"elbo {name!r} is already registered ({LEAN_ELBOS[name].__name__})")
    LEAN_ELBOS[name] = loss
    return loss


# ----------------------------------------------------------------------------------------------
# Pyro's validation: switched per step, restored after the run
# ----------------------------------------------------------------------------------------------


def set_validation(on: bool) -> None:
    """``pyro.enable_validation(on)``: Pyro's checks and torch.distributions' argument checks."""
    pyro.enable_validation(on)


@contextlib.contextmanager
def preserved_validation() -> Iterator[None]:
    """Restore Pyro's three validation flags and torch.distributions' default ``validate_args``
    exactly as they were (``pyro.validation_enabled`` restores torch's from Pyro's flag instead)."""
    saved = (
        _dist_util._VALIDATION_ENABLED,
        _infer_util._VALIDATION_ENABLED,
        _poutine_util._VALIDATION_ENABLED,
        Distribution._validate_args,
    )
    try:
        yield
    finally:
        _dist_util._VALIDATION_ENABLED, _infer_util._VALIDATION_ENABLED, _poutine_util._VALIDATION_ENABLED = saved[:3]
        Distribution.set_default_validate_args(saved[3])


# ----------------------------------------------------------------------------------------------
# Optimiser and matmul precision
# ----------------------------------------------------------------------------------------------


def make_optimizer(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """Adam over ``groups``; the fused implementation (one kernel for all parameters; CPU and CUDA)
    where every parameter allows it. Measured on a 2-core CPU, one thread, for the paper-size invariant
    MLP's 11.3 M parameters: 20 ms per update fused, 171 ms for the default per-tensor loop."""
    params = [p for g in groups for p in g["params"]]
    devices = {p.device.type for p in params}
    fusable = (
        bool(params)
        and len(devices) == 1
        and devices <= {"cpu", "cuda"}
        and all(p.is_floating_point() and not p.is_sparse for p in params)
    )
    if fusable:
        try:
            return torch.optim.Adam(groups, fused=True)
        except (RuntimeError, ValueError, TypeError):  # an older torch or an unsupported dtype
            pass
    return torch.optim.Adam(groups)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """``torch.set_num_threads(threads)`` while the block runs, torch's own count restored after.

    ``None`` changes nothing. The package never changes torch's setting for good: a user's process
    keeps the count it chose once a call returns.
    """
    if threads is None:
        yield
        return
    threads = check_positive_int("threads", threads)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@contextlib.contextmanager
def tf32_matmuls(device: torch.device, enabled: bool) -> Iterator[None]:
    """TF32 for float32 matmuls and convolutions on CUDA while the block runs (restored after).
    ``enabled=False`` changes nothing; on another device it is ignored with a warning."""
    if not enabled:
        yield
        return
    if device.type != "cuda":
        warn_user(f"tf32=True has no effect on device {str(device)!r} (TF32 is a CUDA matmul mode); ignored")
        yield
        return
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9 (mixing it with allow_tf32 is an error)
        saved = (matmul.fp32_precision, conv.fp32_precision if conv is not None else None)
        matmul.fp32_precision = "tf32"
        if conv is not None:
            conv.fp32_precision = "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = saved[0]
            if conv is not None:
                conv.fp32_precision = saved[1]
    else:  # pragma: no cover - older torch
        saved = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ----------------------------------------------------------------------------------------------
# compile: capture the loss as a graph, optionally compile it
# ----------------------------------------------------------------------------------------------


class CaptureError(RuntimeError):
    """The loss could not be captured as a graph equal to the eager ELBO (the reason in one line)."""


def _state_tensors(module: Any) -> list[tuple[str, Tensor]]:
    if not isinstance(module, nn.Module):
        return []
    return [*module.named_parameters(), *module.named_buffers()]


def _same_rng(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if not torch.equal(a["torch"], b["torch"]):
        return False
    if "cuda" in a and "cuda" in b and not all(torch.equal(x, y) for x, y in zip(a["cuda"], b["cuda"])):
        return False
    return bool(
        torch.equal(a["random"]["state"], b["random"]["state"])
        and torch.equal(a["numpy"]["keys"], b["numpy"]["keys"])
        and a["numpy"]["pos"] == b["numpy"]["pos"]
    )


def _first_line(exc: BaseException) -> str:
    inner = getattr(exc, "inner_exception", None)  # torch._dynamo's BackendCompilerFailed wraps the cause
    if isinstance(inner, BaseException):
        exc = inner
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {text[:400]}"


class CapturedLoss:
    """``loss(x, y)`` of ``elbo.differentiable_loss(model, guide, x, y, **kwargs)`` replayed from a
    captured graph (module docstring). Build it with :meth:`capture`, which raises
    :class:`CaptureError` when the graph cannot be built or differs from the eager ELBO; the RNG
    states are as before the call either way.

    Attributes:
        mode: ``"capture"``, ``"inductor"`` (the graph is compiled on its first call) or ``"cudagraphs"``
            (recorded on its first call); ``"capture"`` after a compilation or recording failure.
        failure: the first line of that failure, else ``None``.
        capture_seconds: time spent tracing and checking the graph.
        compile_seconds: time of the first compiled call (compilation included); ``None`` before.
        bit_identical: whether the check found the captured loss and gradients equal to the bit.
    """

    #: ``torch.compile`` backend of ``mode="inductor"`` (tests use ``"aot_eager"``: the same path, fast).
    backend = "inductor"
    #: tolerance of the capture check where the eager ELBO itself is not bit-repeatable (CUDA atomics)
    rtol = 1e-5

    def __init__(self, graph: Any, modules: Sequence[Any], mode: str, device: torch.device) -> None:
        if mode == "cudagraphs" and device.type != "cuda":
            warn_user(
                f"compile='cudagraphs' needs a CUDA device, not {str(device)!r}; replaying the captured graph "
                "instead (compile='capture')",
                RuntimeWarning,
            )
            mode = "capture"
        self.graph, self.modules, self.mode, self.device = graph, list(modules), mode, device
        self.shapes = [(t.shape, t.dtype) for t in self.inputs()]
        self.cudagraphs = mode == "inductor" and device.type == "cuda"
        self.compiled: Callable[..., Tensor] | None = None
        if mode == "cudagraphs":
            self.compiled = self._graphed  # recorded on the first call (make_graphed_callables needs its inputs)
        if mode == "inductor":
            self.compiled = torch.compile(
                graph,
                backend=type(self).backend,
                fullgraph=True,
                dynamic=False,
                mode="reduce-overhead" if self.cudagraphs else None,
            )
        self.capture_seconds = 0.0
        self.compile_seconds: float | None = None
        self.bit_identical = False
        self.failure: str | None = None
        self._graphed_fn: Callable[..., Tensor] | None = None  # compile="cudagraphs": recorded on the first call
        self.batch_shapes: tuple[torch.Size, torch.Size] | None = None

    def inputs(self) -> list[Tensor]:
        """The graph's state inputs, read from the modules on every call (an object a callback replaced
        is picked up; a changed shape is refused)."""
        return [t for m in self.modules for _, t in _state_tensors(m)]

    @classmethod
    def capture(
        cls,
        elbo: Any,
        model: Any,
        guide: Any,
        x: Tensor,
        y: Tensor,
        kwargs: dict[str, Any],
        mode: str,
        device: torch.device,
    ) -> CapturedLoss:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.nn.utils.stateless import _reparametrize_module

        t0 = time.perf_counter()
        modules = [m for m in (model, guide) if isinstance(m, nn.Module)]
        names = [[n for n, _ in _state_tensors(m)] for m in modules]

        def loss_of(*tensors: Tensor) -> Tensor:
            *state, xb, yb = tensors
            with contextlib.ExitStack() as stack:
                pos = 0
                for module, keys in zip(modules, names):
                    stack.enter_context(_reparametrize_module(module, dict(zip(keys, state[pos : pos + len(keys)]))))
                    pos += len(keys)
                return elbo.differentiable_loss(model, guide, xb, yb, **kwargs)

        def eager() -> Tensor:
            return elbo.differentiable_loss(model, guide, x, y, **kwargs)

        state = [t for m in modules for _, t in _state_tensors(m)]
        rng0 = rng_state()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = make_fx(loss_of)(*state, x, y)
            graph.graph.eliminate_dead_code()  # random draws are kept (impure)
            graph.recompile()
        except Exception as exc:  # noqa: BLE001 - any tracing failure means: run eagerly
            set_rng_state(rng0)
            raise CaptureError(f"the loss could not be traced ({_first_line(exc)})") from exc
        self = cls(graph, modules, mode, device)
        self.batch_shapes = (x.shape, y.shape)  # fit's minibatches all have this shape
        try:
            self._check(eager, lambda: graph(*state, x, y), rng0)
        finally:
            set_rng_state(rng0)
        self.capture_seconds = time.perf_counter() - t0
        return self

    def _check(self, eager: Callable[[], Tensor], replay: Callable[[], Tensor], rng0: dict[str, Any]) -> None:
        """Loss, gradients and RNG use of the replayed graph against the eager ELBO, same RNG state."""
        params = [t for t in self.inputs() if t.requires_grad]
        results = []
        for fn in (eager, replay):
            set_rng_state(rng0)
            try:
                loss = fn()
            except Exception as exc:  # noqa: BLE001
                raise CaptureError(f"the captured loss failed ({_first_line(exc)})") from exc
            grads = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else [None] * len(params)
            results.append((loss.detach(), grads, rng_state()))
        (le, ge, re), (lr, gr, rr) = results
        if not _same_rng(re, rr):
            raise CaptureError(
                "the captured loss draws other random numbers than Pyro's (Python- or NumPy-side "
                "randomness is not captured)"
            )
        identical = torch.equal(le, lr) and all(
            (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in zip(ge, gr)
        )
        if not identical:
            worst = _rel_diff(le, lr)
            for a, b in zip(ge, gr):
                if (a is None) != (b is None):
                    raise CaptureError(
                        "the captured loss has other gradients than Pyro's (a parameter is unused in one of them)"
                    )
                if a is not None:
                    worst = max(worst, _rel_diff(a, b))
            if not worst <= self.rtol:
                raise CaptureError(
                    f"the captured loss differs from Pyro's (relative difference {worst:.3g} in the loss or "
                    "a gradient): the model's Python control flow depends on tensor values?"
                )
        self.bit_identical = identical

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        inputs = self.inputs()
        if [(t.shape, t.dtype) for t in inputs] != self.shapes or (x.shape, y.shape) != self.batch_shapes:
            raise CaptureError(
                "the model's or guide's tensors or the minibatch changed shape since the loss was captured"
            )
        if self.compiled is not None:
            return self._compiled_call(inputs, x, y)
        return self.graph(*inputs, x, y)

    def _graphed(self, *tensors: Tensor) -> Tensor:
        """``compile="cudagraphs"``: the graph's forward and backward as CUDA graphs, recorded on the
        first call with the state tensors themselves as static inputs."""
        if self._graphed_fn is None:
            graph = graph_on_device(self.graph, self.device)

            def loss_of(*args: Tensor) -> Tensor:  # a function, not the GraphModule: no module hooks to refuse
                return graph(*args)

            try:
                self._graphed_fn = torch.cuda.make_graphed_callables(loss_of, tuple(tensors), allow_unused_input=True)
            except Exception as exc:
                torch.cuda.synchronize()
                where = host_traffic(graph, tensors, self.device)  # the nodes that need the host, named in the warning
                raise RuntimeError(
                    f"host tensors at {'; '.join(where) or 'no node found'} ({str(exc)[:60]}...)"
                ) from exc
        return self._graphed_fn(*tensors)

    def _compiled_call(self, inputs: list[Tensor], x: Tensor, y: Tensor) -> Tensor:
        """One call of the compiled or CUDA-graphed loss; on any failure (compilation, recompilation,
        recording) a warning and, from then on, the captured graph (``mode="capture"``)."""
        first = self.compile_seconds is None
        rng0 = rng_state() if first else None  # later steps draw other numbers than eager anyway: no snapshot per step
        t0 = time.perf_counter()
        try:
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            with warnings.catch_warnings():
                if first:
                    warnings.simplefilter("ignore")
                loss = self.compiled(*inputs, x, y)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - a compiler / recording failure: replay the captured graph instead
            if rng0 is not None:
                set_rng_state(rng0)
            what = "torch.compile" if self.mode == "inductor" else "CUDA-graph recording"
            warn_user(
                f"compile={self.mode!r}: {what} failed ({_first_line(exc)}); replaying the captured graph "
                "instead (compile='capture')",
                RuntimeWarning,
            )
            self.failure = _first_line(exc)
            self.compiled, self.mode, self.cudagraphs = None, "capture", False
            if first:
                self.compile_seconds = time.perf_counter() - t0
            return self.graph(*inputs, x, y)
        if first:
            self.compile_seconds = time.perf_counter() - t0
        # a CUDA-graph output (Inductor's or make_graphed_callables') is overwritten by the next replay
        return loss.clone() if (self.cudagraphs or self.mode == "cudagraphs") else loss


#: squarings :func:`static_matrix_exp` always performs (masked): exact for 1-norms up to 2**24
_MAX_SQUARINGS = 24
#: Taylor degree of :func:`static_matrix_exp` on the scaled matrix (1-norm at most 1): 1/19! < 1e-17
_TAYLOR_DEGREE = 18


def static_matrix_exp(a: Tensor) -> Tensor:
    """``exp(A)`` for a batch of square matrices ``a`` (``(..., n, n)``) by scaling and squaring with a
    fixed sequence of operations: no value read on the host, so it can be recorded in a CUDA graph.

    ``torch.linalg.matrix_exp`` picks its Padé degree and number of squarings on the host (on CUDA it
    copies the norms to the CPU), which a CUDA-graph recording refuses. Here ``s = ceil(log2 ‖A‖₁)``
    (clamped to ``[0, 24]``) is a tensor: ``A / 2^s`` has 1-norm ≤ 1, its exponential is the Taylor
    polynomial of degree 18 (Horner; truncation error below ``1/19!``, under float64's rounding), and
    the result is squared 24 times, each squaring kept only where ``i < s`` (Higham 2005, "The scaling
    and squaring method for the matrix exponential revisited", with a fixed Taylor degree instead of
    an adaptive Padé one). Equal to ``torch.linalg.matrix_exp`` to rounding for 1-norms below 2**24
    (tested), differentiable by autograd; more matrix products than the adaptive method, which for the
    small generators of this package (n ≤ 12) costs microseconds on a GPU."""
    norm = a.abs().sum(-2).amax(-1)  # (...) 1-norms
    s = torch.ceil(torch.log2(norm.clamp_min(1.0))).clamp(max=_MAX_SQUARINGS)  # 0 for norms ≤ 1
    scaled = a * torch.exp2(-s)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    out = eye
    for k in range(_TAYLOR_DEGREE, 0, -1):  # I + A/1 (I + A/2 (I + ... (I + A/18)))
        out = eye + (scaled @ out) / k
    for i in range(_MAX_SQUARINGS):
        out = torch.where((s > i)[..., None, None], out @ out, out)
    return out


#: ops of a captured graph that read values on the host, and their graph-safe replacements
_GRAPH_SAFE = {torch.ops.aten.linalg_matrix_exp.default: static_matrix_exp}


def graph_on_device(graph: Any, device: torch.device) -> Any:
    """A copy of a captured ``torch.fx.GraphModule`` with its tensor constants moved to ``device``,
    its factory calls made there (``device=cpu`` keyword arguments rewritten) and its host-reading
    ops replaced by graph-safe ones (``matrix_exp`` by :func:`static_matrix_exp`).

    Pyro and the models create small tensors with ``torch.tensor``/``torch.zeros`` and move them to
    the data's device; traced, these are host tensors and host→device copies in the graph, which a
    CUDA graph cannot record (and which would replay stale host work). On the device the graph
    computes the same quantities; a node that still needs the host (a copy to the CPU, a CPU
    generator) makes recording fail, and ``fit`` falls back to the captured graph."""
    import copy

    moved = copy.deepcopy(graph)
    for node in moved.graph.nodes:
        if node.op == "get_attr":
            *path, name = str(node.target).split(".")
            owner = moved
            for part in path:
                owner = getattr(owner, part)
            value = getattr(owner, name)
            if isinstance(value, Tensor) and value.device != device:
                setattr(owner, name, value.to(device))
        elif node.op == "call_function":
            if node.target in _GRAPH_SAFE:
                node.target = _GRAPH_SAFE[node.target]
            where = node.kwargs.get("device")
            if isinstance(where, torch.device) and where != device:
                node.kwargs = {**node.kwargs, "device": device}
    moved.recompile()
    return moved


def host_traffic(graph: Any, inputs: Sequence[Tensor], device: torch.device, limit: int = 4) -> list[str]:
    """Where a graph's forward and backward on ``device`` touch tensors elsewhere (the host): the
    first ``limit`` operations with a tensor argument or result off ``device``, each as
    ``"<node> <op>(<devices>)"`` (``backward`` for the gradient pass). A diagnostic for a failed
    CUDA-graph recording, which cannot copy between host and device; run eagerly, outside capture."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    found: list[str] = []
    current = ["backward"]

    def on_device(t: Tensor) -> bool:
        return t.device.type == device.type and (device.index is None or t.device.index in (None, device.index))

    class Traffic(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            try:
                out = func(*args, **(kwargs or {}))
            except Exception:
                out = None  # a mixed-device call that raises is reported like one that copies
                raise
            finally:
                tensors = [t for t in tree_leaves((args, kwargs or {}, out)) if isinstance(t, Tensor)]
                if len(found) < limit and any(not on_device(t) for t in tensors):
                    devices = ",".join(sorted({str(t.device) + ("" if t.dim() else "[0-d]") for t in tensors}))
                    found.append(f"{current[0]} {func}({devices})")
            return out

    class Named(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:  # noqa: ANN401
            current[0] = n.name
            return super().run_node(n)

    args = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    try:
        with Traffic():
            loss = Named(graph).run(*args)
            current[0] = "backward"
            wrt = [t for t in args if t.requires_grad]
            if wrt and loss.requires_grad:
                torch.autograd.grad(loss, wrt, allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say where it stopped
        found.append(f"{current[0]} raised {_first_line(exc)}")
    return found


def _rel_diff(a: Tensor, b: Tensor) -> float:
    scale = float(a.detach().abs().max()) if a.numel() else 0.0
    diff = float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0
    if math.isnan(diff):
        return 0.0 if bool(torch.equal(a.isnan(), b.isnan())) else math.inf
    return diff / scale if scale > 0 else diff
