"""The lean training step of ``fit`` (``pyro_invariance/infer/fast_step.py``):
Pyro's ELBO without host reads, no per-step synchronisation, the history read in bulk, divergence
located without a per-step check, Pyro's validation restored, ``compile`` (capture / torch.compile,
with fallbacks) and TF32 ignored cleanly on CPU. Sizes are tiny (8×8 digits, H = 16, S = 4)."""

from __future__ import annotations

import os
import signal
import traceback
import warnings

import pyro
import pyro.distributions as dist
import pyro.distributions.util as dist_util
import pyro.infer.util as infer_util
import pyro.poutine.util as poutine_util
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from small_runs import fit_state, small_digits, small_fit, small_model
from torch.distributions import Distribution
from torch.utils._python_dispatch import TorchDispatchMode

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.infer import fast_step, training
from pyro_invariance.infer.checkpoint import CheckpointError, load_checkpoint
from pyro_invariance.infer.fast_step import CapturedLoss, LeanTrace_ELBO, LeanTraceMeanField_ELBO, tf32_matmuls
from pyro_invariance.infer.interrupts import FitInterrupted

torch.set_num_threads(1)

WILD = {"lr": 10.0, "eta_lr": 10.0, "factor_lr": 1.0}  # diverges within ten steps


@pytest.fixture(scope="module")
def data():
    return small_digits()


def _same_run(a, b) -> None:
    assert a.history == b.history
    sa, sb = fit_state(a), fit_state(b)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _validation_flags() -> tuple:
    return (
        dist_util._VALIDATION_ENABLED,
        infer_util._VALIDATION_ENABLED,
        poutine_util._VALIDATION_ENABLED,
        Distribution._validate_args,
    )


# --------------------------------------------------------------------------------------------
# The lean ELBOs are Pyro's
# --------------------------------------------------------------------------------------------


def _loss_and_grads(elbo, model, guide, x, y, seed):
    pyro.set_rng_seed(seed)
    loss = elbo.differentiable_loss(model, guide, x, y, num_data=256)
    params = [*model.parameters(), *guide.parameters()]
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("validation", [True, False])
@pytest.mark.parametrize("particles", [1, 3])
@pytest.mark.parametrize("pair", [(TraceMeanField_ELBO, LeanTraceMeanField_ELBO), (Trace_ELBO, LeanTrace_ELBO)])
def test_lean_elbos_compute_pyros_loss_and_gradients(data, pair, particles, validation):
    """Validation off: the lean mean-field ELBO computes only the log-densities it uses."""
    pyro_cls, lean_cls = pair
    with pi.pyro_scope(), fast_step.preserved_validation():
        pyro.enable_validation(validation)
        model = small_model()
        guide = guides.get("block-cholesky", model)
        x, y = data.x_train[:32], data.y_train[:32]
        guide(x, y, num_data=256)
        la, ga = _loss_and_grads(pyro_cls(num_particles=particles), model, guide, x, y, 3)
        lb, gb = _loss_and_grads(lean_cls(num_particles=particles), model, guide, x, y, 3)
    if particles == 1 and pyro_cls is TraceMeanField_ELBO:
        assert torch.equal(la, lb)  # bit-identical
    else:  # Pyro sums the reported value in Python floats
        assert torch.allclose(la, lb, rtol=1e-6)
    for a, b in zip(ga, gb):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("validation", [True, False])
def test_lean_meanfield_elbo_samples_a_kl_it_cannot_compute(validation):
    """No analytic KL(LogNormal ‖ Exponential): log p − log q of the draw, as Pyro's; auxiliary sites too."""

    def model():
        z = pyro.sample("z", dist.Exponential(2.0))
        pyro.sample("x", dist.Normal(z, 1.0), obs=torch.tensor(0.7))

    def guide():
        loc = pyro.param("loc", torch.tensor(-0.5))
        pyro.sample("u", dist.Normal(loc, 1.0), infer={"is_auxiliary": True})
        pyro.sample("z", dist.LogNormal(loc, 0.3))

    pyro.clear_param_store()
    try:
        with fast_step.preserved_validation():
            pyro.enable_validation(validation)
            out = []
            for elbo in (TraceMeanField_ELBO(), LeanTraceMeanField_ELBO()):
                pyro.set_rng_seed(0)
                loss = elbo.differentiable_loss(model, guide)
                out.append((loss.detach(), torch.autograd.grad(loss, [pyro.param("loc").unconstrained()])[0]))
    finally:
        pyro.clear_param_store()
    (la, ga), (lb, gb) = out
    assert torch.equal(la, lb) and torch.equal(ga, gb)


def test_lean_trace_elbo_keeps_the_score_function_gradient():
    """A discrete guide site: the value is the ELBO estimate, the gradient the surrogate's, as Pyro's."""

    def model():
        z = pyro.sample("z", dist.Bernoulli(0.3))
        pyro.sample("x", dist.Normal(2.0 * z, 1.0), obs=torch.tensor(1.5))

    def guide():
        p = pyro.param("p", torch.tensor(0.6), constraint=dist.constraints.unit_interval)
        pyro.sample("z", dist.Bernoulli(p))

    pyro.clear_param_store()
    try:
        out = []
        for elbo in (Trace_ELBO(num_particles=4), LeanTrace_ELBO(num_particles=4)):
            pyro.set_rng_seed(0)
            loss = elbo.differentiable_loss(model, guide)
            p = pyro.get_param_store().get_param("p").unconstrained()
            out.append((loss.detach(), torch.autograd.grad(loss, [p])[0]))
    finally:
        pyro.clear_param_store()
    (la, ga), (lb, gb) = out
    assert torch.allclose(la, lb, rtol=1e-6) and torch.allclose(ga, gb, rtol=1e-6) and ga.abs() > 0


# --------------------------------------------------------------------------------------------
# No host synchronisation per step; the history read in bulk is the same history
# --------------------------------------------------------------------------------------------


class _HostReads(TorchDispatchMode):
    """Counts reads of tensor values by the host (``.item()``, ``bool()``, ``float()``) outside the
    model's and the guide's own code (models/, guides/)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            files = [f.filename for f in traceback.extract_stack()]
            if not any(os.sep + "models" + os.sep in f or os.sep + "guides" + os.sep in f for f in files):
                self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("compile", ["off", "capture"])
def test_the_loop_reads_no_value_back_per_step(data, compile):
    counts = []
    for steps in (6, 26):
        with _HostReads() as reads:
            small_fit(data, steps=steps, log_every=1000, compile=compile)
        counts.append(reads.count)
    assert counts[0] == counts[1], counts  # twenty more steps, not one more host read


def test_history_and_state_do_not_depend_on_bulk_reads_or_validation(data):
    base = small_fit(data, steps=12, log_every=50)
    assert len(base.history["elbo"]) == 12 and len(base.history["eta"]["rot"]) == 12
    for kw in ({"log_every": 1}, {"log_every": 5}, {"validation": "always"}):
        _same_run(base, small_fit(data, steps=12, **kw))


def test_resume_is_bit_for_bit_across_bulk_reads_validation_and_capture(data, tmp_path):
    full = small_fit(data, checkpoint_path=tmp_path / "full.pt")
    part = small_fit(data, checkpoint_path=tmp_path / "part.pt", checkpoint_every=5, until_step=7, log_every=3)
    assert part.history["step"] == list(range(1, 8))
    # log_every, validation and compile="capture" do not change the numbers: they may change on resume
    resumed = small_fit(data, checkpoint_path=tmp_path / "part.pt", resume=True, log_every=4, validation="always")
    _same_run(full, resumed)
    small_fit(data, checkpoint_path=tmp_path / "cap.pt", until_step=5)
    _same_run(full, small_fit(data, checkpoint_path=tmp_path / "cap.pt", resume=True, compile="capture"))


def test_compile_inductor_is_part_of_the_run_fingerprint(data, tmp_path):
    small_fit(data, checkpoint_path=tmp_path / "c.pt", until_step=3)
    with pytest.raises(CheckpointError, match="setting 'compile' is new"):
        small_fit(data, checkpoint_path=tmp_path / "c.pt", resume=True, compile="inductor")
    assert "compile" not in training.fingerprint_settings(pi.FitConfig(compile="capture"))
    assert "log_every" not in training.fingerprint_settings(pi.FitConfig())


# --------------------------------------------------------------------------------------------
# Divergence: the first bad step, without a per-step check
# --------------------------------------------------------------------------------------------


def test_divergence_is_located_at_the_same_step_and_site_as_a_checked_run(data):
    runs = {}
    for label, kw in (
        ("checked", {"validation": "always"}),
        ("bulk-10", {"log_every": 10}),
        ("bulk-3", {"log_every": 3}),
    ):
        model = small_model()
        guide = guides.get("block-cholesky", model)
        with pytest.raises(FloatingPointError, match=r"at step (\d+): ") as info:
            pi.fit(model, guide, data, steps=30, batch_size=64, progress=False, seed=5, **WILD, **kw)
        state = {
            **{f"m.{k}": v for k, v in model.state_dict().items()},
            **{f"g.{k}": v for k, v in guide.state_dict().items()},
        }
        runs[label] = (str(info.value), state)
    message, state = runs["checked"]
    for label in ("bulk-10", "bulk-3"):
        assert runs[label][0] == message, label
        # left in the state before the bad step, as the checked run
        same = [torch.allclose(state[k], runs[label][1][k], rtol=0, atol=0, equal_nan=True) for k in state]
        assert all(same), (label, [k for k, ok in zip(state, same) if not ok])


def test_divergence_message_names_the_kept_checkpoint_with_bulk_reads(data, tmp_path):
    with pytest.raises(FloatingPointError, match=r"step \d+.*last finite checkpoint .*c\.pt' \(step 5\) is kept"):
        small_fit(data, checkpoint_path=tmp_path / "c.pt", checkpoint_every=5, steps=30, log_every=20, **WILD)
    assert load_checkpoint(tmp_path / "c.pt")["step"] == 5


# --------------------------------------------------------------------------------------------
# Pyro's global validation state is the caller's after fit
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("initial", [True, False])
def test_pyro_validation_is_restored_after_fit(data, initial, tmp_path):
    saved = _validation_flags()
    try:
        pyro.enable_validation(initial)
        before = _validation_flags()
        small_fit(data, steps=4)
        assert _validation_flags() == before
        with pytest.raises(FloatingPointError):
            small_fit(data, steps=30, **WILD)
        assert _validation_flags() == before

        def interrupt(step, model, guide):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)

        with pytest.raises(FitInterrupted):
            small_fit(data, steps=8, callbacks=[interrupt], checkpoint_path=tmp_path / f"i{initial}.pt")
        assert _validation_flags() == before
    finally:
        dist_util._VALIDATION_ENABLED, infer_util._VALIDATION_ENABLED, poutine_util._VALIDATION_ENABLED = saved[:3]
        Distribution.set_default_validate_args(saved[3])


# --------------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------------


def test_capture_gives_the_eager_run_bit_for_bit(data):
    eager = small_fit(data, steps=10)
    captured = small_fit(data, steps=10, compile="capture")
    assert captured.step_stats["compile"] == "capture" and captured.step_stats["bit_identical"]
    _same_run(eager, captured)
    assert eager.step_stats["compile"] == "off"


class _ReadsAValue(PyroModule):
    """Regression on 8×8 images whose forward reads a tensor value (a Python decision)."""

    def __init__(self) -> None:
        super().__init__()
        # a prior built per call (a distribution built once keeps the validation setting of its construction)
        self.w = PyroSample(lambda m: dist.Normal(0.0, 1.0).expand([64]).to_event(1))

    def forward(self, x, y=None, num_data=None):
        x = x.reshape(x.shape[0], -1)
        scale = 1.0 if float(x.abs().max()) > 0 else 2.0
        w = self.w  # sampled outside the data plate
        with pyro.plate("data", num_data or x.shape[0], subsample_size=x.shape[0]):
            return pyro.sample("obs", dist.Normal(x @ w, scale), obs=y)


class _CountsCalls(_ReadsAValue):
    """Its noise scale depends on a Python counter: tracing would bake in one value."""

    calls = 0

    def forward(self, x, y=None, num_data=None):
        type(self).calls += 1
        x = x.reshape(x.shape[0], -1)
        w = self.w
        with pyro.plate("data", num_data or x.shape[0], subsample_size=x.shape[0]):
            return pyro.sample("obs", dist.Normal(x @ w, 1.0 + (type(self).calls % 2)), obs=y)


@pytest.mark.parametrize(
    "model_cls, reason", [(_ReadsAValue, "could not be traced"), (_CountsCalls, "differs from Pyro's")]
)
def test_capture_falls_back_to_eager_with_a_warning(data, model_cls, reason):
    x, y = data.x_train.float(), data.y_train.float()
    runs = []
    for mode in ("off", "capture"):
        with pi.pyro_scope():
            model = model_cls()
            guide = AutoNormal(model)
        if mode == "capture":
            with pytest.warns(RuntimeWarning, match=f"compile='capture': .*{reason}.*; running the eager Pyro step"):
                runs.append(pi.fit(model, guide, (x, y), steps=5, batch_size=32, progress=False, compile=mode))
        else:
            runs.append(pi.fit(model, guide, (x, y), steps=5, batch_size=32, progress=False, compile=mode))
    assert runs[1].step_stats["compile"] == "off" and reason in runs[1].step_stats["fallback"]
    if model_cls is _ReadsAValue:
        assert runs[0].history == runs[1].history  # the fallback is the eager run, RNG untouched


def test_compile_runs_torch_compile_on_the_captured_graph(data, monkeypatch):
    """``compile=True`` (= "inductor") through torch.compile; the aot_eager backend keeps it fast here."""
    monkeypatch.setattr(CapturedLoss, "backend", "aot_eager")
    result = small_fit(data, steps=8, compile=True)
    stats = result.step_stats
    assert result.config.compile == "inductor" and stats["compile"] == "inductor"
    assert stats["compile_seconds"] > 0 and stats["capture_seconds"] > 0
    assert len(result.history["elbo"]) == 8 and all(map(torch.isfinite, torch.tensor(result.history["elbo"])))


def test_a_failing_compiler_falls_back_to_the_captured_graph(data, monkeypatch):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(CapturedLoss, "backend", broken)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*no C\\+\\+ compiler.*replaying the captured graph"):
        result = small_fit(data, steps=6, compile="inductor")
    assert result.step_stats["compile"] == "capture"
    _same_run(small_fit(data, steps=6), result)  # the captured graph: the eager numbers


def _lean_and_pyro_losses(lean: type, pyro_loss_and_grads, vectorize: bool) -> list[tuple[float, list]]:
    """(value, guide-parameter gradients) of a lean loss and of Pyro's ``loss_and_grads`` under the same
    draws (seed 3, 8 particles) on basis regression with the symmetry-conditional guide (auxiliary sites);
    a gradient is ``None`` where the loss leaves that parameter untouched."""
    from pyro_invariance.diagnostics.reference import entry

    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get("symmetry-conditional", model, init_scale=0.3, weight_covariance="mvn")
    out = []
    with pi.pyro_scope(), fast_step.preserved_validation():  # the flags are process-wide: restored after
        pyro.enable_validation(False)
        guide(x, y)
        params = list(guide.parameters())
        kwargs = {"num_particles": 8, "vectorize_particles": vectorize, "max_plate_nesting": 1}
        for which in ("lean", "pyro"):
            pyro.set_rng_seed(3)
            if which == "pyro":
                loss = pyro_loss_and_grads(kwargs)(model, guide, x, y)
            else:
                value = lean(**kwargs).differentiable_loss(model, guide, x, y)
                value.backward()
                loss = float(value.detach())
            out.append((loss, [p.grad for p in params]))
            for p in params:
                p.grad = None
    return out


@pytest.mark.parametrize("vectorize", [True, False])
def test_lean_iwae_is_pyros_renyi_elbo_at_alpha_zero(vectorize):
    """``elbo="iwae"``: the loss and its gradients equal Pyro's ``RenyiELBO(alpha=0)`` (the IWAE bound)
    under the same draws, for vectorised and sequential particles, on a guide with auxiliary sites."""
    from pyro.infer import RenyiELBO

    from pyro_invariance.infer.fast_step import LeanIWAE_ELBO

    (l1, g1), (l2, g2) = _lean_and_pyro_losses(
        LeanIWAE_ELBO, lambda kwargs: RenyiELBO(alpha=0.0, **kwargs).loss_and_grads, vectorize
    )
    assert l1 == pytest.approx(l2, rel=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("vectorize", [True, False])
def test_lean_rws_is_pyros_reweighted_wake_sleep(vectorize):
    """``elbo="rws"``: the guide's gradients equal Pyro's ``ReweightedWakeSleep(insomnia=1)`` wake-φ
    gradients under the same draws, and the value is the negative IWAE bound (wake-θ's loss)."""
    from pyro.infer import ReweightedWakeSleep

    from pyro_invariance.infer.fast_step import LeanRWS_ELBO

    def pyro_rws(kwargs):
        rws = ReweightedWakeSleep(insomnia=1.0, model_has_params=False, **kwargs)
        return lambda *args: rws.loss_and_grads(*args)[0]  # (wake-θ loss, φ loss): the first is −IWAE

    (l1, g1), (l2, g2) = _lean_and_pyro_losses(LeanRWS_ELBO, pyro_rws, vectorize)
    assert l1 == pytest.approx(l2, rel=1e-6)
    # AutoStructured's locations and dependency weights enter only through the (detached) draws: no
    # gradient in either; fit refuses elbo="rws" for such a guide (test_rws_refuses_a_guide_it_cannot_train)
    assert [p is None for p in g1] == [p is None for p in g2] and sum(p is not None for p in g1) >= 4
    g1, g2 = [g for g in g1 if g is not None], [g for g in g2 if g is not None]
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_rws_moves_a_gaussian_guide_to_the_posteriors_moments():
    """Wake-φ minimises the inclusive KL(p ‖ q): on a conjugate model (z ~ N(0, 1), y_i ~ N(z, 1)) a
    Normal guide started ten times too narrow and 2.3 posterior sds off centre ends at the exact
    posterior's mean and sd (measured with seeds 1, 2: loc 0.538-0.542 vs 0.540, scale 0.442-0.443 vs
    0.447). When q is the posterior the weights are uniform and the wake-φ gradient vanishes in
    expectation, so the exact posterior is a fixed point for any K."""
    from pyro.infer.autoguide import AutoNormal

    y = torch.tensor([0.3, 1.1, 0.4, 0.9])
    post_var = 1.0 / (1.0 + len(y))
    post_mean = float(y.sum()) * post_var

    class Conjugate(PyroModule):
        def forward(self, x, y, num_data=None):  # x: unused inputs (fit takes pairs)
            z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0))
            with pyro.plate("data", len(y)):
                pyro.sample("obs", pyro.distributions.Normal(z, 1.0), obs=y)

    with pi.pyro_scope():
        model = Conjugate()
        guide = AutoNormal(model, init_scale=0.1 * post_var**0.5, init_loc_fn=lambda site: torch.tensor(-0.5))
    result = pi.fit(
        model,
        guide,
        (torch.zeros(len(y), 1), y),
        steps=400,
        lr=0.05,
        batch_size=None,
        num_particles=16,
        elbo="rws",
        seed=0,
        progress=False,
    )
    assert result.config.elbo == "rws"
    loc, scale = float(guide.locs.z), float(guide.scales.z)
    assert loc == pytest.approx(post_mean, abs=0.05) and scale == pytest.approx(post_var**0.5, rel=0.1)


@pytest.mark.parametrize("name", ["symmetry-conditional", "map"])
def test_rws_refuses_a_guide_it_cannot_train(name):
    from pyro_invariance.diagnostics.reference import entry

    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get(name, model)
    message = r"elbo='rws' cannot train the guide parameters \[.*\] of .*: .*use another elbo"
    with pytest.raises(ValueError, match=message) as info:
        pi.fit(model, guide, (x, y), steps=2, batch_size=None, num_particles=4, elbo="rws", progress=False)
    assert "\n" not in str(info.value)


def test_fit_with_the_iwae_bound(data):
    result = small_fit(data, steps=4, elbo="iwae", num_particles=3)
    assert result.config.elbo == "iwae" and all(map(torch.isfinite, torch.tensor(result.history["elbo"])))
    with pytest.raises(ValueError, match="unknown elbo 'renyi'"):
        small_fit(data, steps=2, elbo="renyi")


def test_a_registered_elbo_is_built_by_name_and_checks_the_guide_first(data):
    """``register_elbo``: ``fit(..., elbo=name)`` builds the registered loss by ``for_model`` and calls its
    ``check_guide`` once before the first step; a taken name is refused, an unknown one still is."""
    checked = []

    class Checked(fast_step.LeanTrace_ELBO):
        def check_guide(self, guide, x, y, **kwargs):
            checked.append((type(guide).__name__, tuple(x.shape)))

    try:
        assert fast_step.register_elbo("checked-trace", Checked) is Checked
        assert fast_step.register_elbo("checked-trace", Checked) is Checked  # the same loss again: accepted
        result = small_fit(data, steps=2, elbo="checked-trace")
        assert result.config.elbo == "checked-trace" and len(checked) == 1
        with pytest.raises(ValueError, match="elbo 'iwae' is already registered"):
            fast_step.register_elbo("iwae", Checked)
    finally:
        fast_step.LEAN_ELBOS.pop("checked-trace", None)
    with pytest.raises(ValueError, match="unknown elbo 'checked-trace'"):
        small_fit(data, steps=2, elbo="checked-trace")


def test_a_compiler_failure_after_the_first_step_falls_back_to_the_captured_graph(data, monkeypatch):
    """A recompilation can fail on a later step (seen on CUDA with torch 2.11): fit goes on with the
    captured graph, with a warning and the reason in ``step_stats``."""
    calls = []

    def fails_on_second_call(gm, example_inputs):
        def run(*args):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("Attempt to trace generator")
            return gm(*args)

        return run

    monkeypatch.setattr(CapturedLoss, "backend", fails_on_second_call)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*trace generator.*replaying the captured graph"):
        result = small_fit(data, steps=6, compile="inductor")
    assert result.step_stats["compile"] == "capture" and "trace generator" in result.step_stats["fallback"]
    assert len(calls) == 2 and all(map(torch.isfinite, torch.tensor(result.history["elbo"])))


def test_cudagraphs_is_capture_with_a_warning_off_cuda(data):
    with pytest.warns(RuntimeWarning, match="compile='cudagraphs' needs a CUDA device, not 'cpu'"):
        result = small_fit(data, steps=5, compile="cudagraphs")
    assert result.step_stats["compile"] == "capture"
    _same_run(small_fit(data, steps=5), result)


def test_cudagraphs_records_the_captured_graph_once_with_the_state_as_static_inputs(data, monkeypatch):
    """The wiring of ``compile="cudagraphs"`` without a GPU: make_graphed_callables is replaced by a
    recorder that returns the function itself, so the run must equal the eager one."""
    recorded = []

    def record(fn, sample_args, allow_unused_input=False):
        recorded.append((sample_args, allow_unused_input))
        return fn

    real_init = CapturedLoss.__init__

    def as_if_on_cuda(self, graph, modules, mode, device):
        real_init(self, graph, modules, mode, torch.device("cuda"))

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", record)
    monkeypatch.setattr(CapturedLoss, "__init__", as_if_on_cuda)
    monkeypatch.setattr(fast_step, "graph_on_device", lambda graph, device: graph)  # no CUDA here
    result = small_fit(data, steps=6, compile="cudagraphs")
    assert result.step_stats["compile"] == "cudagraphs" and len(recorded) == 1
    args, allow_unused = recorded[0]
    state = [t for m in (result.model, result.guide) for t in (*m.parameters(), *m.buffers())]
    assert allow_unused and all(any(a is t for a in args) for t in state)  # the parameters themselves, not copies
    monkeypatch.undo()
    _same_run(small_fit(data, steps=6), result)


def test_graph_on_device_leaves_no_host_tensors_in_the_graph(data):
    """Before CUDA-graph recording the captured graph is moved to the device (there, constants and
    factory calls on the host made an H100 recording fail: 'Cannot copy between CPU and CUDA'); the
    meta device stands in for CUDA here: every tensor the moved graph computes is on it."""
    x, y = data.x_train[:64].float(), data.y_train[:64]
    model = small_model()
    guide = guides.get("block-cholesky", model)
    with pyro.poutine.block():
        guide(x, y, num_data=256)
    with pi.pyro_scope(), fast_step.preserved_validation():  # the flags are process-wide: restored after
        pyro.enable_validation(False)
        captured = CapturedLoss.capture(
            LeanTraceMeanField_ELBO(), model, guide, x, y, {"num_data": 256}, "capture", torch.device("cpu")
        )
    meta = torch.device("meta")
    moved = fast_step.graph_on_device(captured.graph, meta)
    host = [
        n
        for n in captured.graph.graph.nodes
        if n.op == "call_function" and n.kwargs.get("device") == torch.device("cpu")
    ]
    assert host  # the CPU trace has host factory calls (eye, randn, ...), so the test means something
    assert not [
        n for n in moved.graph.nodes if n.op == "call_function" and n.kwargs.get("device") == torch.device("cpu")
    ]
    constants = [getattr(moved, n.target) for n in moved.graph.nodes if n.op == "get_attr"]
    assert all(t.device == meta for t in constants if isinstance(t, torch.Tensor))
    seen = []

    class Devices(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.extend(t.device for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

    inputs = [t.detach().to(meta) for t in captured.inputs()] + [x.to(meta), y.to(meta)]
    with Devices():
        loss = moved(*inputs)
    assert loss.shape == () and seen and set(seen) == {meta}
    assert host[0].kwargs["device"] == torch.device("cpu")  # the captured graph itself is unchanged
    # matrix_exp reads norms on the host (on CUDA: a copy, which made the H100 recordings fail): replaced
    expm = torch.ops.aten.linalg_matrix_exp.default
    assert any(n.target is expm for n in captured.graph.graph.nodes)
    assert not any(n.target is expm for n in moved.graph.nodes)
    assert any(n.target is fast_step.static_matrix_exp for n in moved.graph.nodes)
    # the diagnostic a failed recording reports: nothing on the moved graph, the host calls on the unmoved one
    assert fast_step.host_traffic(moved, inputs, meta) == []
    where = fast_step.host_traffic(captured.graph, inputs, meta, limit=3)
    assert (
        where
        and all("cpu" in w for w in where)
        and any("meta" in w for w in where)
        and where[0].split()[0] in {n.name for n in captured.graph.graph.nodes}
    )


def test_graph_on_device_leaves_no_host_tensors_in_the_symmetrised_hnn():
    """The symmetrised HNN (quadratic generators: matrix exponentials; two vectorised weight samples)
    moved to the meta device computes on it alone, forward and backward (its H100 recording failed
    before matrix_exp was replaced, and was recorded after: benchmarks/results/gpu_step_time_cuda_run3)."""
    from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN

    pyro.set_rng_seed(0)
    model = SymmetrisedHNN(4, (8, 8), symmetry="quadratic", num_generators=2, num_transforms=3, euler_steps=2, dt=0.1)
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    with pi.pyro_scope():
        guide = guides.get("matrix-normal", model, init_scale=0.01)
        with pyro.poutine.block():
            guide(x, y, num_data=5)
    elbo = LeanTraceMeanField_ELBO(num_particles=2, vectorize_particles=True, max_plate_nesting=1)
    with pi.pyro_scope(), fast_step.preserved_validation():
        pyro.enable_validation(False)
        captured = CapturedLoss.capture(elbo, model, guide, x, y, {"num_data": 5}, "capture", torch.device("cpu"))
    expm = torch.ops.aten.linalg_matrix_exp.default
    assert any(n.target is expm for n in captured.graph.graph.nodes)  # the case the replacement is for
    meta = torch.device("meta")
    moved = fast_step.graph_on_device(captured.graph, meta)
    inputs = [t.detach().to(meta).requires_grad_(t.requires_grad) for t in captured.inputs()] + [x.to(meta), y.to(meta)]
    assert fast_step.host_traffic(moved, inputs, meta) == []
    assert fast_step.host_traffic(captured.graph, inputs, meta, limit=1)  # unmoved, it would copy


def test_compile_cudagraphs_is_part_of_the_run_fingerprint(data, tmp_path):
    small_fit(data, checkpoint_path=tmp_path / "c.pt", until_step=4)
    with pytest.raises(CheckpointError, match="compile"):
        small_fit(data, checkpoint_path=tmp_path / "c.pt", resume=True, compile="cudagraphs")


@pytest.mark.slow
def test_inductor_compiles_the_loss_on_cpu(data):
    result = small_fit(data, steps=6, compile="inductor")
    assert result.step_stats["compile"] == "inductor", result.step_stats
    assert all(map(torch.isfinite, torch.tensor(result.history["elbo"])))


# --------------------------------------------------------------------------------------------
# Settings that only matter on a GPU, and vectorised particles
# --------------------------------------------------------------------------------------------


def test_tf32_is_ignored_with_a_warning_on_cpu(data):
    matmul = torch.backends.cuda.matmul.fp32_precision
    with pytest.warns(UserWarning, match="tf32=True has no effect on device 'cpu'"):
        with_tf32 = small_fit(data, steps=4, tf32=True)
    assert torch.backends.cuda.matmul.fp32_precision == matmul
    _same_run(small_fit(data, steps=4), with_tf32)


def test_tf32_switch_is_restored():
    """The CUDA flags are process settings: set inside the block, restored after (no GPU needed)."""
    before = torch.backends.cuda.matmul.fp32_precision
    with tf32_matmuls(torch.device("cuda"), True):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tf32_matmuls(torch.device("cpu"), False):  # off: nothing, no warning
            pass


def test_inductor_uses_no_cuda_graphs_on_cpu(data, monkeypatch):
    monkeypatch.setattr(CapturedLoss, "backend", "aot_eager")
    seen = []
    real = CapturedLoss.__init__

    def recording(self, *a, **k):
        real(self, *a, **k)
        seen.append(self.cudagraphs)

    monkeypatch.setattr(CapturedLoss, "__init__", recording)
    small_fit(data, steps=3, compile="inductor")
    assert seen == [False]


@pytest.mark.parametrize("particles, vectorised", [(1, False), (3, True)])
def test_particles_are_vectorised_where_the_model_allows(data, monkeypatch, particles, vectorised):
    made = []

    class Recording(fast_step.LeanTraceMeanField_ELBO):
        def __init__(self, **kwargs):
            made.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setitem(training.LEAN_ELBOS, "meanfield", Recording)
    small_fit(data, steps=2, num_particles=particles)
    assert made[0]["vectorize_particles"] is (vectorised and type(small_model()).vectorizable_particles)
    assert made[0].get("max_plate_nesting") == (1 if made[0]["vectorize_particles"] else None)


@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.5, 3.0, 30.0, 100.0])
def test_static_matrix_exp_equals_matrix_exp(scale):
    """The graph-safe exponential (fixed operations, no host reads) against torch's adaptive Padé
    one, float64, 1-norms from 0 to ~500 (finite results); rotation generators at large angles in float32."""
    a = torch.randn(20, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * scale
    ref = torch.linalg.matrix_exp(a)
    assert bool(ref.isfinite().all())
    err = (fast_step.static_matrix_exp(a) - ref).abs().amax((-2, -1)) / ref.abs().amax((-2, -1))
    assert float(err.max()) < 1e-11
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]]) * torch.tensor([0.1, 3.14, 40.0])[:, None, None]
    assert torch.allclose(fast_step.static_matrix_exp(rot), torch.linalg.matrix_exp(rot), atol=1e-5)


def test_static_matrix_exp_gradients_pass_gradcheck():
    a = torch.randn(3, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2.0
    assert torch.autograd.gradcheck(fast_step.static_matrix_exp, (a.requires_grad_(),))
