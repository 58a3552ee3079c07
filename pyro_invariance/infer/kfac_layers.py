"""KFAC curvature of a whole layer-wise network at its MAP point, for the Laplace evidence.

:func:`kfac_curvature` runs the network on minibatches with forward hooks on the modules that have a
KFAC rule (the relaxed blocks and the dense head layers), backpropagates the columns of the
categorical Hessian square root ``L_n`` (``L Lᵀ = diag(p) − p pᵀ``; ``labels="exact"``: all C
columns, the exact expectation of the GGN) or the score of one label drawn from the model
(``labels="sampled"``: ``p − e_ŷ``, an unbiased estimate with one backward pass) to every hooked
module's output, and hands input, output and those output gradients to the module's rule, which
returns its :class:`KFACBlock` s (Kronecker factors of one or more sample sites; paper 004 Sec. 5,
Martens & Grosse 2015, Grosse & Martens 2016). Factors are averaged over all N data points.

:class:`KFACCurvature` turns the blocks into what the Laplace evidence needs, per precision group g
(paper 004 Eq. 9, the log-determinant in the Kronecker eigenbasis with δ added exactly, as
laplace-torch does)::

    log det(N G ⊗ A + δ I) = Σ_ij log(N λ_i^G λ_j^A + δ)   → eigenvalues(sites) = {N λ_i^G λ_j^A}

and the posterior marginal variances ``diag((N G⊗A + δI)⁻¹)_{kl} = Σ_ij Q^G_{ki}² Q^A_{lj}² / (N λ_i^G λ_j^A + δ)``.

Rules are registered per module class with :func:`kfac_rule` (a relaxed block's rule asks a second
registry, :func:`pathway_rule`, for each pathway), so a new layer type adds its KFAC by registering
a rule; a network with a module that has parameters but no rule is refused with its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pyro import poutine
from torch import Tensor, nn

from pyro_invariance.infer.distributed import Ranks
from pyro_invariance.infer.kfac import (
    KroneckerFactors,
    categorical_hessian_sqrt,
    conv2d_factors,
    dense_factors,
    ffc_factors,
    gconv_factors,
    sconv_factors,
    sfc_factors,
)
from pyro_invariance.symmetry import equivariant_layers as L
from pyro_invariance.validation import check_choice

__all__ = ["KFACBlock", "KFACCurvature", "LABELS", "kfac_curvature", "kfac_rule", "pathway_rule"]

#: how the GGN's expectation over labels is taken: exactly, with one label drawn from the model, or
#: with the observed labels (the empirical Fisher, which is not the GGN: biased where the model is wrong)
LABELS = ("exact", "sampled", "empirical")


@dataclass
class KFACBlock:
    """Kronecker factors of the sample sites ``sites`` laid side by side: the block's parameter
    matrix is ``[site_1 | site_2 | …]`` with site k reshaped to ``(rows of G, widths[k])``, and
    ``N·G ⊗ A`` approximates the GGN of that matrix flattened row-major (e.g. an FC layer's
    ``[W | b]`` with the bias folded into A as a constant input; for one site: the GGN of
    ``site.flatten()``, whichever of G and A holds the gradients)."""

    sites: tuple[str, ...]
    factors: KroneckerFactors
    widths: tuple[int, ...]

    def renamed(self, prefix: str) -> KFACBlock:
        return KFACBlock(tuple(f"{prefix}{s}" for s in self.sites), self.factors, self.widths)


#: ``rule(module, inputs, output) -> finish(output_grads (N, K, *output.shape[1:])) -> blocks``. The rule
#: runs inside the network's forward (in a forward hook, where the sample sites hold their values),
#: ``finish`` once the output gradients are known.
Finisher = Callable[[Tensor], list[KFACBlock]]
_RULES: dict[type, Callable[..., Finisher]] = {}
#: ``rule(pathway, x, scale) -> finish(grads at the pathway's output) -> blocks``, called by a relaxed
#: block's rule (in the forward as well)
_PATHWAY_RULES: dict[type, Callable[..., Finisher]] = {}


def kfac_rule(cls: type) -> Callable[[Callable[..., Finisher]], Callable[..., Finisher]]:
    """Register the KFAC rule of a module class (subclasses inherit it)."""

    def register(fn: Callable[..., Finisher]) -> Callable[..., Finisher]:
        _RULES[cls] = fn
        return fn

    return register


def pathway_rule(cls: type) -> Callable[[Callable[..., Finisher]], Callable[..., Finisher]]:
    """Register the KFAC rule of a relaxed block's pathway class."""

    def register(fn: Callable[..., Finisher]) -> Callable[..., Finisher]:
        _PATHWAY_RULES[cls] = fn
        return fn

    return register


def _lookup(table: dict[type, Callable[..., Finisher]], obj: Any) -> Callable[..., Finisher] | None:
    for cls in type(obj).__mro__:
        if cls in table:
            return table[cls]
    return None


# ------------------------------------------------------------------------------------------------
# rules


@kfac_rule(L.BayesianLinear)
def _bayesian_linear(layer: L.BayesianLinear, x: Tensor, out: Tensor) -> Finisher:
    """``y = (s·x) θᵀ + b``: A over ``[s·x, 1]``, exact for one data point (Martens & Grosse 2015)."""
    a = torch.cat([x * layer.scale, x.new_ones(x.shape[0], 1)], dim=1)
    return lambda grads: [KFACBlock(("weight", "bias"), dense_factors(a, grads), (layer.in_features, 1))]


@pathway_rule(L.FullyConnected)
def _fully_connected(path: L.FullyConnected, x: Tensor, scale: float) -> Finisher:
    """FC pathway inside a block: ``y = (s·g·x) θᵀ + s·b`` (He gain g, block scale s = 1/√K)."""
    gain = math.sqrt(2.0 / path.spec.in_size)
    flat = x.reshape(x.shape[0], -1)
    a = torch.cat([flat * (gain * scale), flat.new_full((flat.shape[0], 1), scale)], dim=1)
    return lambda grads: [KFACBlock(("weight", "bias"), dense_factors(a, grads.flatten(2)), (path.spec.in_size, 1))]


@pathway_rule(L.Convolution)
def _convolution(path: L.Convolution, x: Tensor, scale: float) -> Finisher:
    """CONV pathway: KFC of the circular 3×3 convolution of ``s·g·x`` (Grosse & Martens 2016);
    the gradients at the full-resolution convolution output ``(N, K, C'G', H, W)``."""
    s = path.spec
    gain = math.sqrt(2.0 / (s.in_channels * L.KERNEL * L.KERNEL))
    inputs = x.reshape(x.shape[0], s.in_channels, s.h_in, s.w_in) * (gain * scale)

    def finish(grads: Tensor) -> list[KFACBlock]:
        fac = conv2d_factors(inputs, grads, L.KERNEL, padding=L.KERNEL // 2, padding_mode="circular", bias=False)
        return [KFACBlock(("weight",), fac, (s.in_channels * L.KERNEL * L.KERNEL,))]

    return finish


def _single_sites(factors: dict[str, KroneckerFactors]) -> list[KFACBlock]:
    return [KFACBlock((site,), fac, (fac.A.shape[0],)) for site, fac in factors.items()]


@pathway_rule(L.FactoredFullyConnected)
def _factored_fully_connected(path: L.FactoredFullyConnected, x: Tensor, scale: float) -> Finisher:
    """F-FC: one block per factor θ₁, θ₂ (paper 004 Sec. 5.1; :func:`~pyro_invariance.infer.kfac.ffc_factors`)."""
    w_out, w_in = path.weight_out.detach(), path.weight_in.detach()  # read in the forward, where the sites are set
    return lambda grads: _single_sites(ffc_factors(x, grads, w_out, w_in, scale=scale))


@pathway_rule(L.SparseFullyConnected)
def _sparse_fully_connected(path: L.SparseFullyConnected, x: Tensor, scale: float) -> Finisher:
    """S-FC: F-FC's factors projected through the RBF bases
    (Sec. 5.2; :func:`~pyro_invariance.infer.kfac.sfc_factors`)."""
    w_out, w_in = path.weight_out.detach(), path.weight_in.detach()
    return lambda grads: _single_sites(
        sfc_factors(
            x,
            grads,
            w_out,
            w_in,
            path.basis_out,
            path.basis_in,
            scale=scale,
            gain_out=path.scale_out,
            gain_in=path.scale_in,
        )
    )


@pathway_rule(L.SparseConvolution)
def _sparse_convolution(path: L.SparseConvolution, x: Tensor, scale: float) -> Finisher:
    """S-CONV: KFC with the input factor projected through the anchor basis (Sec. 5.2)."""
    return lambda grads: _single_sites(sconv_factors(x, grads, path.basis, scale=scale, gain=path.scale))


@pathway_rule(L.GroupConvolution)
def _group_convolution(path: L.GroupConvolution, x: Tensor, scale: float) -> Finisher:
    """p4 GCONV: KFC over rotated patches, rotations × positions as locations
    (:func:`~pyro_invariance.infer.kfac.gconv_factors`; an extension, the paper derives CONV, F-FC, S-*)."""
    s = path.spec

    def finish(grads: Tensor) -> list[KFACBlock]:
        g = grads.reshape(*grads.shape[:2], s.c_out, L.P4, s.h_in, s.w_in)
        return _single_sites(gconv_factors(x, g, scale=scale))

    return finish


@kfac_rule(L.RelaxedBlock)
def _relaxed_block(block: L.RelaxedBlock, x: Tensor, out: Tensor) -> Finisher:
    """A relaxed block ``ReLU(P(Σ_eq f_k(x)) + Σ_other f_k(x) + b)``: the gradient at the sum is
    the output gradient where the output is positive; the non-equivariant pathways see it as is,
    the equivariant ones at full resolution (scattered back through the per-example polyphase
    selection at stride 2, :func:`_polyphase_scatter`); the bias (shared over group and positions)
    is exact: ``A = [1]``, ``G = Σ_nk s sᵀ / N`` with ``s`` the gradient summed over group and positions."""
    spec = block.spec
    scale = 1.0 / math.sqrt(len(block.kinds))
    finishers: list[tuple[str, bool, Finisher]] = []
    for kind in block.kinds:
        path = block.pathway(kind)
        rule = _lookup(_PATHWAY_RULES, path)
        if rule is None:
            raise NotImplementedError(
                f"no KFAC rule for the {kind!r} pathway ({type(path).__name__}); register one "
                "with pyro_invariance.infer.kfac_layers.pathway_rule or use curvature='diagonal'"
            )
        finishers.append((kind, path.equivariant, rule(path, x, scale)))
    index = _polyphase_index(block, x, scale) if spec.stride == 2 and block.equivariant_kinds else None

    def finish(grads: Tensor) -> list[KFACBlock]:
        n, k = grads.shape[:2]
        g_sum = grads * (out > 0).unsqueeze(1)  # (N, K, C', G', H', W'): ReLU'(pre) = 1[out > 0]
        blocks: list[KFACBlock] = []
        for kind, equivariant, fin in finishers:
            g = g_sum
            if equivariant:
                g = g.reshape(n, k, spec.out_channels, spec.h_out, spec.w_out)
                if index is not None:
                    g = _polyphase_scatter(g, index, spec.h_in, spec.w_in)
            blocks += [b.renamed(f"{kind}.") for b in fin(g)]
        s = g_sum.sum(dim=(3, 4, 5))  # (N, K, C')
        bias = KroneckerFactors(torch.einsum("nko,nkp->op", s, s) / n, s.new_ones(1, 1), n)
        return blocks + [KFACBlock(("bias",), bias, (1,))]

    return finish


def _polyphase_index(block: L.RelaxedBlock, x: Tensor, scale: float) -> Tensor:
    """The polyphase component the block's forward selects for each example ``(N,)``, recomputed
    from the full-resolution sum of its equivariant pathways (as in the forward)."""
    spec = block.spec
    filters = sum(block.pathway(kind).filters(scale) for kind in block.equivariant_kinds)
    with torch.no_grad():
        full = L.circular_conv2d(x.reshape(x.shape[0], spec.in_channels, spec.h_in, spec.w_in), filters)
        return L.polyphase_select(full)[1]


def _polyphase_scatter(g: Tensor, index: Tensor, h: int, w: int) -> Tensor:
    """Gradients ``(N, K, M, h/2, w/2)`` after the polyphase selection of component ``index (N,)``
    → ``(N, K, M, h, w)`` at the full resolution (zeros at the components not selected)."""
    out = g.new_zeros(*g.shape[:3], h, w)
    view = out.view(*g.shape[:3], h // 2, 2, w // 2, 2)  # component 2a + b: [..., a, :, b]
    rows = torch.arange(g.shape[0], device=g.device)
    view[rows, :, :, :, index // 2, :, index % 2] = g
    return out


# ------------------------------------------------------------------------------------------------
# the curvature of a network


class KFACCurvature:
    """KFAC blocks of a network (full site names) with their eigendecompositions, in the form the
    Laplace evidence uses (module docstring)."""

    def __init__(self, blocks: list[KFACBlock]) -> None:
        self.blocks = blocks
        self._by_site: dict[str, KFACBlock] = {}
        for b in blocks:
            for s in b.sites:
                if s in self._by_site:
                    raise ValueError(f"site {s!r} is in two KFAC blocks")
                self._by_site[s] = b
        self._eig: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}

    def _decomposed(self, b: KFACBlock) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        key = id(b)
        if key not in self._eig:
            lg, qg = torch.linalg.eigh(b.factors.G.double())
            la, qa = torch.linalg.eigh(b.factors.A.double())
            self._eig[key] = (lg.clamp_min(0.0), qg, la.clamp_min(0.0), qa)
        return self._eig[key]

    def _blocks_of(self, sites: list[str]) -> list[KFACBlock]:
        missing = [s for s in sites if s not in self._by_site]
        if missing:
            raise KeyError(f"no KFAC block for sites {missing[:3]}")
        out: list[KFACBlock] = []
        for s in sites:
            b = self._by_site[s]
            if not any(b is o for o in out):
                out.append(b)
        for b in out:
            if not set(b.sites) <= set(sites):
                raise ValueError(f"the KFAC block of {b.sites} spans several precision groups")
        return out

    def eigenvalues(self, sites: list[str]) -> Tensor:
        """``{N λ_i^G λ_j^A}`` of the blocks of ``sites`` (float64, one per parameter)."""
        parts = []
        for b in self._blocks_of(sites):
            lg, _, la, _ = self._decomposed(b)
            parts.append((b.factors.num_data * torch.outer(lg, la)).reshape(-1))
        return torch.cat(parts)

    def marginal_variances(self, sites: list[str], delta: float, shapes: dict[str, torch.Size]) -> dict[str, Tensor]:
        """``diag((N G⊗A + δ I)⁻¹)`` of every site, in the site's shape (float64)."""
        out: dict[str, Tensor] = {}
        for b in self._blocks_of(sites):
            lg, qg, la, qa = self._decomposed(b)
            inv = 1.0 / (b.factors.num_data * torch.outer(lg, la) + delta)
            var = qg.square() @ inv @ qa.square().T  # (rows, Σ widths)
            for site, cols in zip(b.sites, var.split(list(b.widths), dim=1)):
                out[site] = cols.reshape(shapes[site])
        return out


def _hooked(model: nn.Module) -> Iterator[tuple[str, nn.Module, Callable[..., Finisher]]]:
    for name, module in model.named_modules():
        rule = _lookup(_RULES, module)
        if rule is not None:
            yield name, module, rule


def _label_columns(logits: Tensor, labels: str, generator: torch.Generator | None, y: Tensor | None) -> list[Tensor]:
    """The vectors backpropagated from the logits ``(B, C)``: the C columns of the categorical
    Hessian's square root (``"exact"``), or the score ``p − e_y`` of one label per example, drawn
    from the model (``"sampled"``) or observed (``"empirical"``)."""
    if labels == "exact":
        sqrt_h = categorical_hessian_sqrt(logits)  # (B, C, C); column c: L[:, :, c]
        return [sqrt_h[:, :, c] for c in range(logits.shape[-1])]
    probs = torch.softmax(logits, -1)
    y_hat = torch.multinomial(probs, 1, generator=generator).squeeze(-1) if labels == "sampled" else y
    return [probs - F.one_hot(y_hat, logits.shape[-1]).to(probs.dtype)]  # type: ignore[arg-type]


def kfac_curvature(
    model: nn.Module,
    values: dict[str, Tensor],
    x: Tensor,
    *,
    batch_size: int = 32,
    labels: str = "exact",
    generator: torch.Generator | None = None,
    y: Tensor | None = None,
    ranks: Ranks | None = None,
) -> KFACCurvature:
    """KFAC GGN of ``Σ_n log p(y_n | x_n, θ)`` at ``values`` (module docstring).

    Args:
        model: a network ``model(x) -> logits (B, C)`` whose parameterised modules have KFAC rules.
        values: the sample sites' values (the MAP point), by site name.
        x: inputs ``(N, ...)``, processed in minibatches of ``batch_size``.
        labels: ``"exact"`` (C backward passes per minibatch), ``"sampled"`` (one, labels drawn
            from the model with ``generator``) or ``"empirical"`` (one, the observed labels ``y``).
        y: the observed labels ``(N,)``, for ``labels="empirical"``.
        ranks: the ranks of a data-parallel run (:mod:`pyro_invariance.infer.distributed`), each
            passing its own rows of the data as ``x`` (and ``y``): the factors' sums over rows are
            summed over the ranks (all-reduce) before they are normalised by the total N, so every
            rank gets the curvature of all the data.
    """
    check_choice("labels", labels, LABELS)
    if labels == "empirical" and (y is None or y.shape != x.shape[:1]):
        raise ValueError("labels='empirical' needs the observed labels y, one per row of x")
    hooked = list(_hooked(model))
    if not hooked:
        raise TypeError(f"{type(model).__name__} has no module with a KFAC rule")
    records: list[tuple[str, Finisher, Tensor]] = []  # this minibatch's (module name, rule's finisher, output tap)

    def hook(name: str, rule: Callable[..., Finisher]) -> Callable[..., Tensor]:
        def fn(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
            with torch.no_grad():
                finish = rule(module, inputs[0].detach(), output.detach())
            tap = torch.zeros_like(output, requires_grad=True)
            records.append((name, finish, tap))
            return output + tap

        return fn

    detached = {k: v.detach() for k, v in values.items()}
    sums: dict[tuple[str, ...], list[Any]] = {}
    n_total = x.shape[0]
    handles = [m.register_forward_hook(hook(name, rule)) for name, m, rule in hooked]
    try:
        for i in range(0, n_total, batch_size):
            xb = x[i : i + batch_size]
            records.clear()
            dummy = torch.zeros(xb.shape[0], dtype=torch.long, device=x.device)
            with poutine.block(), poutine.condition(data={**detached, "obs": dummy}):
                with torch.enable_grad():
                    logits = model(xb)
                    columns = _label_columns(
                        logits.detach(), labels, generator, None if y is None else y[i : i + batch_size]
                    )
                    taps = [tap for _, _, tap in records]
                    per_tap: list[list[Tensor]] = [[] for _ in taps]
                    for j, col in enumerate(columns):
                        grads = torch.autograd.grad(logits, taps, grad_outputs=col, retain_graph=j + 1 < len(columns))
                        for store, g in zip(per_tap, grads):
                            store.append(g.detach())
                with torch.no_grad():  # the finishers read sample sites too: inside the conditioning
                    for (name, finish, _), store in zip(records, per_tap):
                        prefix = f"{name}." if name else ""
                        for block in finish(torch.stack(store, dim=1)):
                            block = block.renamed(prefix)
                            nb = block.factors.num_data
                            acc = sums.setdefault(block.sites, [0.0, 0.0, block.widths])
                            acc[0] = acc[0] + block.factors.G.double() * nb
                            acc[1] = acc[1] + block.factors.A.double() * nb
    finally:
        for h in handles:
            h.remove()
    if ranks is not None and ranks.ddp:  # every rank's sums, in the same block order (same network)
        for acc in sums.values():
            acc[0], acc[1] = ranks.sum(acc[0]), ranks.sum(acc[1])
        n_total = int(ranks.sum(torch.tensor([float(n_total)], dtype=torch.float64, device=x.device)).item())
    return KFACCurvature(
        [
            KFACBlock(sites, KroneckerFactors(g / n_total, a / n_total, n_total), widths)
            for sites, (g, a, widths) in sums.items()
        ]
    )
