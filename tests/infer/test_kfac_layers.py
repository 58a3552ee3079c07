"""KFAC curvature of the layer-wise networks: per-block factors against the exact GGN
from Jacobians, the polyphase scatter, sampled labels, marginal variances, the δ updates on the
KFAC evidence and ``fit_laplace(curvature="kfac")``'s resume."""

import math

import pytest
import torch
from pyro import poutine
from test_laplace import _data, _model_and_map

from pyro_invariance.infer import kfac_layers
from pyro_invariance.infer.checkpoint import CheckpointError
from pyro_invariance.infer.kfac_layers import kfac_curvature
from pyro_invariance.infer.laplace import (
    DiagonalLaplacePosterior,
    fit_laplace,
    gradient_update,
    laplace_log_evidence,
    log_likelihood,
    mackay_update,
)
from pyro_invariance.symmetry import equivariant_layers as L

torch.set_num_threads(1)


def _exact_ggn(model, values, x, sites):
    """Σ_n J_nᵀ Λ_n J_n of the sites' elements (concatenated flat, in order), float64, dense."""
    sizes = [values[s].numel() for s in sites]
    vals = {k: v.double() for k, v in values.items()}
    flat0 = torch.cat([vals[s].reshape(-1) for s in sites])
    model = model.double()

    def logits_of(flat, xn):
        parts = {s: p.reshape(values[s].shape) for s, p in zip(sites, flat.split(sizes))}
        with poutine.block(), poutine.condition(data={**vals, **parts, "obs": torch.zeros(1, dtype=torch.long)}):
            return model(xn)[0]

    total = 0.0
    try:
        for n in range(x.shape[0]):
            xn = x[n : n + 1].double()
            jac = torch.autograd.functional.jacobian(lambda f: logits_of(f, xn), flat0)
            p = torch.softmax(logits_of(flat0, xn), -1)
            total = total + jac.T @ (torch.diag(p) - torch.outer(p, p)) @ jac
    finally:
        model.float()
    return total


def _block_order(block, values):
    """Indices that put the flat concatenation of the block's sites in the block's [s1 | s2] row-major order."""
    rows, cols, offset = block.factors.G.shape[0], [], 0
    for site, width in zip(block.sites, block.widths):
        cols.append(torch.arange(values[site].numel()).reshape(rows, width) + offset)
        offset += values[site].numel()
    return torch.cat(cols, dim=1).reshape(-1)


@pytest.mark.parametrize("variant", ["fc", "fc+conv"])
def test_kfac_blocks_of_dense_layers_equal_the_exact_ggn_on_one_input(variant):
    """KFAC is exact for a dense layer on one data point (Martens & Grosse 2015): FC pathways with
    their bias, block biases (also through ReLU masks and stride-2 polyphase blocks) and the head;
    a convolution is exact where its map is 1×1. Larger maps: KFC's approximation (not asserted)."""
    model, values = _model_and_map(variant)
    x, _ = _data()
    curv = kfac_curvature(model, values, x[:1], batch_size=1)
    checked = 0
    for block in curv.blocks:
        layer = block.sites[0].rsplit(".", 1)[0]
        module = model.get_submodule(layer) if not layer.endswith("bias") else None
        one_by_one = isinstance(module, L.Convolution) and module.spec.h_in * module.spec.w_in == 1
        if isinstance(module, L.Convolution) and not one_by_one:
            continue
        exact = _exact_ggn(model, values, x[:1], list(block.sites))
        order = _block_order(block, values)
        exact = exact[order][:, order]
        err = float((block.factors.block().double() - exact).norm() / exact.norm())
        assert err < 1e-5, (block.sites, err)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("variant", ["fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv"])
def test_kfac_sites_cover_every_precision_group_once(variant):
    """Every pathway type has a rule; their blocks cover each precision group's sites exactly."""
    model, values = _model_and_map(variant)
    x, _ = _data()
    curv = kfac_curvature(model, values, x[:4])
    assert sorted(s for b in curv.blocks for s in b.sites) == sorted(
        s for g in model.precision_groups() for s in g.sites
    )
    for g in model.precision_groups():
        p = sum(values[s].numel() for s in g.sites)
        assert curv.eigenvalues(list(g.sites)).shape == (p,)
        assert bool((curv.eigenvalues(list(g.sites)) >= 0).all())


def test_polyphase_scatter_equals_the_gradient_through_the_selection():
    """At stride 2 the equivariant pathways see the output gradient scattered back through the
    per-example polyphase selection: equal to autograd through ``polyphase_select``; the index the
    rule recomputes is the forward's."""
    full = torch.randn(5, 6, 8, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
    selected, index = L.polyphase_select(full)
    g = torch.randn(5, 3, *selected.shape[1:], generator=torch.Generator().manual_seed(1))
    ref = torch.stack([torch.autograd.grad(selected, full, g[:, k], retain_graph=True)[0] for k in range(3)], 1)
    assert torch.equal(kfac_layers._polyphase_scatter(g, index, 8, 8), ref)
    assert set(index.tolist()) != {index[0].item()}  # several components chosen: the test means something

    model, values = _model_and_map("fc+conv")
    x, _ = _data()
    i, block = next((j, b) for j, b in enumerate(model.blocks) if b.spec.stride == 2)
    seen = {}

    def record(module, inputs, output):
        seen["index"] = kfac_layers._polyphase_index(module, inputs[0], 1 / math.sqrt(2))

    original = L.polyphase_select

    def spy(t):
        out = original(t)
        seen.setdefault("forward", out[1])
        return out

    handle = block.register_forward_hook(record)
    try:
        L.polyphase_select = spy  # the block calls it through the module
        with poutine.block(), poutine.condition(data=values):
            h = x[:6].unsqueeze(2)
            for b in model.blocks[: i + 1]:
                h = b(h)
    finally:
        L.polyphase_select = original
        handle.remove()
    assert torch.equal(seen["index"], seen["forward"])


def test_sampled_labels_average_to_the_exact_expectation():
    model, values = _model_and_map("fc+conv")
    x, _ = _data()
    exact = kfac_curvature(model, values, x[:6], labels="exact")
    gen = torch.Generator().manual_seed(0)
    draws = [kfac_curvature(model, values, x[:6], labels="sampled", generator=gen) for _ in range(150)]
    for k, block in enumerate(exact.blocks):
        if block.sites[0].startswith("head.1"):
            mean_g = torch.stack([d.blocks[k].factors.G for d in draws]).mean(0)
            assert float((mean_g - block.factors.G).norm() / block.factors.G.norm()) < 0.15
            assert torch.equal(draws[0].blocks[k].factors.A, block.factors.A)  # A does not depend on labels


def test_empirical_labels_use_the_observed_labels():
    """The empirical Fisher: the score of the observed label, ``p − e_y``, one column per example;
    the head's G equals its brute-force definition."""
    model, values = _model_and_map("fc")
    x, y = _data()
    curv = kfac_curvature(model, values, x[:6], labels="empirical", y=y[:6])
    head = next(b for b in curv.blocks if b.sites[0].startswith("head.1"))
    with poutine.block(), poutine.condition(data={**values, "obs": y[:6]}):
        logits = model(x[:6])
    g = torch.softmax(logits, -1) - torch.nn.functional.one_hot(
        y[:6], logits.shape[-1]
    )  # dlogp/dlogits of head.1's output
    assert torch.allclose(head.factors.G, (g.T @ g / 6).double(), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="observed labels"):
        kfac_curvature(model, values, x[:6], labels="empirical")


def test_marginal_variances_are_the_diagonal_of_the_dense_inverse():
    model, values = _model_and_map("fc")
    x, _ = _data()
    curv = kfac_curvature(model, values, x[:6])
    block = next(b for b in curv.blocks if b.sites[0].startswith("head.1"))
    delta = 0.7
    dense = torch.linalg.inv(
        block.factors.block().double() + delta * torch.eye(block.factors.num_params, dtype=torch.float64)
    )
    var = curv.marginal_variances(list(block.sites), delta, {k: v.shape for k, v in values.items()})
    # (rtol 1e-6, not 1e-12: the eigenvalues are clamped at 0, the float32 factors' rounding makes some -1e-8)
    order = _block_order(block, values)
    flat = torch.cat([var[s].reshape(-1) for s in block.sites])
    assert torch.allclose(flat, dense.diagonal()[torch.argsort(order)], rtol=1e-6), float(
        (flat - dense.diagonal()[torch.argsort(order)]).abs().max()
    )


def test_delta_updates_on_the_kfac_evidence_reach_its_maximum():
    """MacKay's fixed point and the gradient steps both maximise the KFAC evidence in every δ
    (θ* and curvature fixed); a ±10 % change of any δ afterwards lowers it."""
    x, _ = _data()
    for update in ("mackay", "gradient"):
        model, values = _model_and_map("fc+conv")
        curv = kfac_curvature(model, values, x)
        ll = log_likelihood(model, values, x, _data()[1])
        before = laplace_log_evidence(model, values, curv, ll)
        if update == "mackay":
            for _ in range(60):
                mackay_update(model, values, curv)
        else:
            gradient_update(model, values, curv, steps=1500, lr=0.05)
        best = laplace_log_evidence(model, values, curv, ll)
        assert best > before
        for g in model.precision_groups()[::3]:
            d = float(g.value)
            for f in (0.9, 1.1):
                g.value.fill_(d * f)
                assert laplace_log_evidence(model, values, curv, ll) <= best + 1e-6 * abs(best), (update, g.name)
            g.value.fill_(d)


def test_kfac_posterior_is_read_by_the_analysis():
    model, values = _model_and_map("fc+conv")
    x, _ = _data()
    curv = kfac_curvature(model, values, x)
    post = DiagonalLaplacePosterior(model, values, curv)
    d = post.get_distribution("head.1.weight")
    assert d.scale.shape == values["head.1.weight"].shape and bool((d.scale > 0).all())


def test_a_pathway_without_rule_is_refused_by_name(monkeypatch):
    model, values = _model_and_map("fc+conv")
    x, _ = _data()
    monkeypatch.delitem(kfac_layers._PATHWAY_RULES, L.FullyConnected)
    with pytest.raises(NotImplementedError, match="'fc' pathway.*curvature='diagonal'"):
        kfac_curvature(model, values, x[:2])
    with pytest.raises(ValueError, match="labels"):
        kfac_curvature(model, values, x[:2], labels="fisher")


def test_fit_laplace_with_kfac_and_gradient_resumes_bit_for_bit(tmp_path):
    from test_laplace import SHAPE, LayerwiseNet

    x, y = _data(n=40)
    kw = dict(
        steps=12,
        every=4,
        warmup=4,
        ggn_batch_size=8,
        batch_size=16,
        progress=False,
        lr=1e-2,
        curvature="kfac",
        delta_update="gradient",
        delta_steps=20,
    )

    def run(**extra):
        import pyro

        pyro.set_rng_seed(0)
        model = LayerwiseNet("fc+conv", SHAPE, 3, alpha=1, prior="fixed")
        return fit_laplace(model, "map", (x, y), **{**kw, **extra})

    full = run()
    assert len(full.evidence_log) == 3 and math.isfinite(full.log_evidence)
    # the final curvature reuses the step-12 update's (same θ*, exact labels): the same evidence as a recomputation
    model, guide = full.model, full.guide
    values = {k: v.detach() for k, v in guide.median().items()}
    fresh = kfac_curvature(model, values, x, batch_size=8)
    assert laplace_log_evidence(model, values, fresh, log_likelihood(model, values, x, y)) == pytest.approx(
        full.log_evidence, rel=1e-9
    )
    run(checkpoint_path=tmp_path / "c.pt", until_step=6)
    resumed = run(checkpoint_path=tmp_path / "c.pt", resume=True)
    assert resumed.history == full.history
    assert resumed.log_evidence == full.log_evidence
    with pytest.raises(CheckpointError, match="laplace"):
        run(checkpoint_path=tmp_path / "c.pt", resume=True, curvature="diagonal")


# --------------------------------------------------------------------------------------------
# learning with KFAC-Laplace, settings fixed before the first run: quadrant digits, the 40-class
# task, α = 1, 200 MAP steps, KFAC-Laplace updates every 50 after 50 (fit_laplace's defaults: exact
# labels, 100 Adam steps on log δ), equivariant start, seeds 0, 1, 2.

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def kfac_quadrant_fits():
    import pyro
    from test_laplace import LayerwiseNet

    import pyro_invariance as pi
    from pyro_invariance.data.quadrant import build_quadrant_dataset

    data = build_quadrant_dataset("digits", 40)
    out = {}
    for seed in SEEDS:
        for variant in ("conv", "fc+conv"):
            pyro.set_rng_seed(seed)
            model = LayerwiseNet(variant, (1, 16, 16), 40, alpha=1, prior="fixed")
            # (ggn_batch_size only sets how the exact-label curvature sums are chunked: speed, not the result)
            res = fit_laplace(
                model,
                "map",
                data,
                steps=200,
                every=50,
                warmup=50,
                batch_size=128,
                progress=False,
                lr=1e-2,
                seed=seed,
                ggn_batch_size=512,
            )
            out[variant, seed] = (model, res, pi.evaluate(res, data, num_samples=1, num_particles=1)["accuracy"])
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_kfac_laplace_learned_model_sees_the_quadrant_and_switches_off_fc_early(kfac_quadrant_fits, seed):
    """CONV cannot tell the quadrant (chance is 1/40 on that part); the learned FC+CONV can, and the
    KFAC evidence raises δ_FC (switches the FC pathway towards off) in most early blocks (0-3)."""
    conv_acc = kfac_quadrant_fits["conv", seed][2]
    model, res, acc = kfac_quadrant_fits["fc+conv", seed]
    print(
        f"seed {seed}: CONV {conv_acc:.3f}, FC+CONV {acc:.3f}, δ_FC",
        [f"{float(b.fc.precision):.3g}" for b in model.blocks],
    )
    assert acc >= conv_acc + 0.20
    assert sum(float(model.blocks[b].fc.precision) > 1.0 for b in range(4)) >= 3
    assert all(math.isfinite(e) for _, e in res.evidence_log)
