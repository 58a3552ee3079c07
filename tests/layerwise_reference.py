"""Reference forward of the layer-wise blocks and networks: the direct formula of paper 004 as the
layers computed it before they were optimised for step time, kept to check the optimised code
(fused filters, folded 1/√K, fused bias, gathered polyphase component, circular padding with a
lean backward) against it.

Everything takes the sample sites' values explicitly (``values``: site name -> tensor, names
relative to the module passed), so the same values drive both implementations.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_invariance.symmetry import equivariant_layers as L

KERNEL = 3


def circular_conv2d(x, weight):
    p = weight.shape[-1] // 2
    return F.conv2d(F.pad(x, (p, p, p, p), mode="circular"), weight)


def polyphase_select(x):
    comps = torch.stack([x[..., a::2, b::2] for a in (0, 1) for b in (0, 1)], dim=1)
    norms = comps.reshape(comps.shape[0], 4, -1).square().sum(-1)
    index = norms.argmax(dim=1)
    return comps[torch.arange(x.shape[0], device=x.device), index], index


def pathway(layer, x, values, prefix=""):
    """One pathway's output ``(B, C', G', H, W)`` (equivariant, stride 1) or at the output size."""
    s = layer.spec
    b = x.shape[0]
    v = {name: values[prefix + name] for name in {**type(layer).weights, **type(layer).biases}}
    kind = layer.kind
    if kind == "fc":
        gain = math.sqrt(2.0 / s.in_size)
        y = x.reshape(b, -1) @ (v["weight"] * gain).T + v["bias"]
        return y.reshape(b, s.c_out, s.g_out, s.h_out, s.w_out)
    if kind in ("ffc", "sfc"):
        k, c = s.out_channels, s.in_channels
        if kind == "ffc":
            theta1 = v["weight_out"].reshape(k, c, -1) * math.sqrt(2.0 / c)
            theta2 = v["weight_in"].reshape(k, c, -1) / math.sqrt(s.h_in * s.w_in)
        else:
            theta1 = v["weight_out"].reshape(k, c, -1) @ layer.basis_out * layer.scale_out
            theta2 = v["weight_in"].reshape(k, c, -1) @ layer.basis_in * layer.scale_in
        z = torch.einsum("bcp,kcp->bkc", x.reshape(b, c, -1), theta2)
        y = torch.einsum("bkc,kcq->bkq", z, theta1)
        return y.reshape(b, s.c_out, s.g_out, s.h_out, s.w_out)
    h, w = x.shape[-2:]
    if kind == "conv":
        gain = math.sqrt(2.0 / (s.in_channels * KERNEL * KERNEL))
        filters = (v["weight"] * gain).reshape(s.out_channels, s.in_channels, KERNEL, KERNEL)
    elif kind == "sconv":
        u = v["weight"].reshape(s.out_channels, s.in_channels, -1)
        filters = (u @ layer.basis * layer.scale).reshape(s.out_channels, s.in_channels, KERNEL, KERNEL)
    elif kind == "gconv":
        theta = v["weight"] * math.sqrt(2.0 / (s.in_channels * KERNEL * KERNEL))
        if s.g_in == 1:
            filters = L.p4_lift_filters(theta.reshape(s.c_out, s.c_in, KERNEL, KERNEL))
        else:
            filters = L.p4_group_filters(theta.reshape(s.c_out, s.c_in, L.P4, KERNEL, KERNEL))
    else:
        raise ValueError(kind)
    y = circular_conv2d(x.reshape(b, s.in_channels, h, w), filters)
    return y.reshape(b, s.c_out, s.g_out, h, w)


def block(module, x, values, prefix=""):
    """``ReLU((1/√K)·[P(Σ_equivariant f_k(x)) + Σ_other f_k(x)] + b)`` computed directly."""
    s = module.spec
    kinds = module.kinds
    equivariant = [pathway(module.pathway(k), x, values, f"{prefix}{k}.") for k in kinds if L.PATHWAYS[k].equivariant]
    others = [pathway(module.pathway(k), x, values, f"{prefix}{k}.") for k in kinds if not L.PATHWAYS[k].equivariant]
    total = None
    if equivariant:
        total = torch.stack(equivariant).sum(0) if len(equivariant) > 1 else equivariant[0]
        if s.stride == 2:
            total, _ = polyphase_select(total)
    for y in others:
        total = y if total is None else total + y
    total = total / math.sqrt(len(kinds)) + values[prefix + "bias"].reshape(1, -1, 1, 1, 1)
    return F.relu(total)


def network_logits(net, x, values):
    """Logits of a :class:`~pyro_invariance.models.layerwise.LayerwiseNet` from the reference blocks."""
    h = x.unsqueeze(2)
    for i, b in enumerate(net.blocks):
        h = block(b, h, values, f"blocks.{i}.")
    h = h.amax(dim=2) if net.arch.group else h.squeeze(2)
    z = h.flatten(1)
    for j, layer in enumerate(net.head):
        z = z @ (values[f"head.{j}.weight"] * layer.scale).T + values[f"head.{j}.bias"]
        if j == 0:
            z = F.relu(z)
    return z


def sample_sites(module, *args, **kwargs):
    """Names and values of the (unobserved) sample sites of one call, in the order visited."""
    trace = poutine.trace(module).get_trace(*args, **kwargs)
    return {
        n: site["value"]
        for n, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and type(site["fn"]).__name__ != "_Subsample"
    }
