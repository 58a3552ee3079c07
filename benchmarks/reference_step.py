"""The JAX reference's training step, timed alone: its jitted VI loss and gradient plus the optimiser update.

The reference is the code of Noether's razor (github.com/tychovdo/noethers-razor), a checkout named by
``--reference-dir``. This script imports the reference's modules from there (``train``, ``network``, ``dynamics``,
``data``, ``utils``) and calls its functions; it copies none of them. It needs a Python with the reference's imports
(JAX, optax, diffrax, numpy, matplotlib, tqdm, psutil) and imports neither torch, pyro nor this project's package, so
it runs on a bare GPU machine and in a plain JAX environment. It prints one JSON line on stdout (everything the
reference prints goes to stderr).

**Where the reference's step is.** ``train.make_vi_step`` (module level, ``jax.jit`` with the Hamiltonian model
``h_model`` and the sizes static) returns ``jax.value_and_grad`` of the −ELBO per datum: ``mc_samples`` weight draws
from the matrix-normal posterior (``network.sample_weights``, vmapped), each predicting the next state by ``steps``
explicit-Euler sub-steps over ``stepsize`` (``train.predict``, diffrax) of the symplectic gradient of
``network.batch_hnn_H``, which averages the MLP Hamiltonian over ``sym_samples`` symmetry samples
``expm(π Σ_k w_k G_k)`` of the K learned quadratic generators (``--group quadratic_learn<K>``), or is the plain MLP
(no ``--group``: the plain HNN); plus the Kronecker-factored KL. It calls ``jax.debug.print`` on every step (a host
callback with the per-sample MSEs). Everything else of a step is built in ``train.train_model`` around that call,
interleaved with evaluation, figures and logging: Adam (optax, cosine schedule) on the posterior and on the conserved
quantities' parameters, and the closed-form prior-precision update ``utils.auto_prior_prec`` (where
``--prior_prec_method empirical``, the 3-body scripts); the parameters and the data come from ``main.main``, which
also imports torch for its data loader. Neither function can be stopped before its loop, so this script does what
they do up to the first step with the reference's own builders (``network.init_mlp_vi``,
``dynamics.*.init_affine_as_subgroup``, ``data.generate_dataset``, ``train.trajectory_to_batches``,
``network.batch_hnn_H``) and its command-line defaults: ``main.py``'s ``parser.add_argument`` calls are read from its
source (:func:`reference_parser`), not retyped. Running ``main.py`` with a patched loop was the other way; it would
need torch and would time its data loader too.

**What is timed** (``--update fused``, the default): one ``jax.jit`` (state buffers donated) of

    state, key → make_vi_step's −ELBO and gradients → Adam on the posterior → Adam on the generators →
    auto_prior_prec

compiled ahead of time (``lower(...).compile()``, timed on its own: ``compile_s``), then ``--warmup`` untimed steps,
then ``--steps`` steps, each ended by ``jax.block_until_ready`` on the new state and loss. ``jax.debug.print`` is
replaced by a no-op before anything is traced, and nothing is logged. ``--update eager`` times the same body as
``train_model`` runs it: only ``make_vi_step`` jitted, the updates op by op (``compile_s`` is then the first step).

**Settings, fixed before any result** (:data:`REFERENCE_ARGS`): the command lines of the reference's
``scripts/harmonic-oscillator/table1.sh`` (SHO: 7 trajectories × 4 steps = 28 pairs per step, full batch, hidden
200 × 200, ELU α = 2, S = 200, E = 20 Euler sub-steps of 0.2, 20 weight samples, K = 1) and
``scripts/nbody/table3.sh`` (3-body: batches of 20 trajectories × 50 steps = 1000 pairs, hidden 250 × 250 × 250,
ELU, S = 100 ball samples, E = 10 of 1.0, 2 weight samples, K = 10, empirical prior precisions), the learned line
(``--group quadratic_learn1`` / ``quadratic_learn10``) and the plain HNN line (no group). Left out: ``--seed``
(the default seed is used), and the 3-body scripts' ``--load_model`` (a warm-up checkpoint: the same shapes; the
step's cost does not depend on the values). The batch is the first B trajectories of ``main.py``'s training set
(``generate_dataset`` draws trajectory i from the i-th key whatever the set's size; ``main.py``'s torch loader picks
B of them at random), so the 3-body set is not generated in full. Hyper-parameters enter as float32 arrays (the
reference passes Python floats at first, then arrays once ``auto_prior_prec`` has run: one more compile of its step).
The step after the KL warm-up is timed (KL weight 1; ``burnin`` is overridden to False inside ``make_vi_step``).
Defaults: 2 warm-up and 20 timed steps; ``--smoke``: toy widths and samples (:data:`SMOKE_ARGS`), 1 + 3 steps.

**On the GPU machine** ``benchmarks/gpu_session.sh`` takes a checkout along in ``.gpu/noethers-razor`` (git-ignored;
its header says how to make it) and calls ``benchmarks/timing.py --section gpu --parts reference --reference-dir
.gpu/noethers-razor``, whose ``run_reference`` runs this script once per system and variant, each in its own process
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX must not claim most of the GPU beside torch; ``JAX_PLATFORMS=cpu`` on
CPU), and keeps each JSON line with the settings compared against ``timing.py``'s ``HNN`` (:func:`compare_settings`).

**What the earlier number included.** The reference was timed before as the interval between the first ``wandb.log``
of consecutive epochs of ``main.py`` (one step per epoch for SHO). That interval held, besides this step: the
``jax.debug.print`` callback, the optimiser updates dispatched op by op, the batch assembled by torch's data loader
and ``trajectory_to_batches``, dozens of logged norms and scalars each read back to the host, four matplotlib
figures per learned generator drawn to PNG every epoch, ``gc.collect()``, and every tenth epoch the evaluation of
the training set and three test sets (with figures every hundredth). This script times none of these.

Run: ``python benchmarks/reference_step.py --reference-dir <checkout> --system hnn-sho --variant learned``
(``--dry-run`` prints the settings without JAX).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: the reference's command lines per system, less ``--group`` (see :data:`LEARNED_GROUP`), ``--seed`` and
#: ``--load_model``: scripts/harmonic-oscillator/table1.sh and scripts/nbody/table3.sh of the reference
REFERENCE_ARGS: dict[str, list[str]] = {
    "hnn-sho": shlex.split(
        "--train_size 7 --train_steps 4 --steps 20 --stepsize 0.20 --sym_steps 50 --vi --measure_scale 1.0 "
        "--init_prior_var 1 --output_var 0.001 --output_noise 0.001 --dynamics harmonic-oscillator --act_fun elu2 "
        "--n_layers 3 --n_hidden 200 --sym_samples 200 --sym_over_path --lr_param 0.001 --mc_samples 20 "
        "--n_epochs 5000 --fixed_basis_scale 1.0"
    ),
    "hnn-3body": shlex.split(
        "--batch_size 20 --vi --measure_scale 1.0 --init_prior_var 1.0 --output_var 0.001 --dynamics nbody_2d_3b "
        "--train_size 200 --train_steps 50 --stepsize 1.0 --act_fun elu --n_hidden 250 --n_layers 4 --n_epochs 1000 "
        "--sym_samples 100 --sym_over_path --lr_param 0.001 --lr_hyper 0.1 --prior_prec_method empirical "
        "--basis_prec 1.0 --output_var_method fixed --init_posterior_scale 10.0 --output_noise 0.001 "
        "--lr_cyper 0.01 --mc_samples 2 --conserved_init_std 0.01 --n_burnin 0 --measure_dist ball --bch_order 1"
    ),
}
#: the learned-symmetry line's ``--group`` per system (the plain HNN line has none)
LEARNED_GROUP = {"hnn-sho": "quadratic_learn1", "hnn-3body": "quadratic_learn10"}
VARIANTS = ("learned", "plain")
#: toy sizes for the tests: seconds on one CPU core
SMOKE_ARGS = shlex.split(
    "--n_hidden 8 --sym_samples 4 --mc_samples 2 --steps 2 --train_size 2 --train_steps 3 --batch_size -1"
)
_TYPES = {"str": str, "int": int, "float": float}
#: the reference's names for our settings: its symmetry measure, its prior-precision method, its activation
SAMPLING = {"uniform": "cube", "ball": "ball"}
PRIOR = {"gradients": "fixed", "fixed": "fixed", "empirical": "closed-form"}  # its hyper optimiser is never stepped
ELU_ALPHA = {"elu": 1.0, "elu2": 2.0, "elu5": 5.0}


def reference_parser(main_py: Path) -> argparse.ArgumentParser:
    """The reference's command line, read from its ``main.py`` without running it (its imports need torch and wandb):
    every ``parser.add_argument(...)`` call with literal arguments, so the defaults are the reference's own."""
    parser = argparse.ArgumentParser(prog=str(main_py), add_help=False)
    for node in ast.walk(ast.parse(main_py.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            kwargs = {
                k.arg: _TYPES[k.value.id] if k.arg == "type" else ast.literal_eval(k.value)
                for k in node.keywords
                if k.arg is not None
            }
            parser.add_argument(*map(ast.literal_eval, node.args), **kwargs)
    return parser


def reference_argv(system: str, variant: str, smoke: bool = False) -> list[str]:
    """The reference's command line for ``system`` (a key of :data:`REFERENCE_ARGS`) and ``variant``."""
    if system not in REFERENCE_ARGS or variant not in VARIANTS:
        raise ValueError(f"unknown system/variant {system!r}/{variant!r}; use {list(REFERENCE_ARGS)} / {VARIANTS}")
    group = ["--group", LEARNED_GROUP[system]] if variant == "learned" else []
    return [*REFERENCE_ARGS[system], *group, *(SMOKE_ARGS if smoke else [])]


def reference_namespace(main_py: Path, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by the reference's parser, with ``main.py``'s one rewrite (no learned group: no generator
    learning rate) and a check that the run is one this script rebuilds."""
    ns = reference_parser(main_py).parse_args(list(argv))
    if "learn" not in ns.group:
        ns.lr_cyper = 0.0
    unsupported = {
        "--vi": not ns.vi,
        "--sym_over_path": not ns.sym_over_path,  # main.py refuses to run without it
        "--group quadratic_learn<K> or none": ns.group and not re.fullmatch(r"quadratic_learn\d+", ns.group),
        "--residual": ns.residual,
        "--fixed_basis": ns.fixed_basis,
        "--map_mean": ns.map_mean,
        "--canonicalise": ns.canonicalise,
        "--multisteps 1": ns.multisteps != 1,
        "--basis_prec 1": ns.basis_prec != 1.0,
        "--scheduler cosine": ns.scheduler != "cosine",
        "--output_var_method fixed": ns.output_var_method != "fixed",
    }
    if bad := [k for k, v in unsupported.items() if v]:
        raise ValueError(f"this script rebuilds the reference's step only with {bad}")
    return ns


def state_dim(dynamics: str) -> int:
    """Phase-space dimension M of the reference's ``--dynamics`` name (``nbody_<d>d_<n>b``: 2·d·n)."""
    if dynamics == "harmonic-oscillator":
        return 2
    if m := re.fullmatch(r"nbody_(\d+)d_(\d+)b", dynamics):
        return 2 * int(m[1]) * int(m[2])
    raise ValueError(f"unsupported dynamics {dynamics!r}")


def settings_of(ns: argparse.Namespace) -> dict[str, Any]:
    """The sizes one step of the reference works at, in the words of ``timing.py``'s ``HNN`` settings."""
    trajectories = ns.train_size if ns.batch_size == -1 else min(ns.batch_size, ns.train_size)
    k = int(ns.group.removeprefix("quadratic_learn")) if ns.group else 0
    return {
        "dynamics": ns.dynamics,
        "state_dim": state_dim(ns.dynamics),
        "group": ns.group or "none (plain HNN)",
        "num_generators": k,
        "trajectories_per_step": trajectories,
        "pairs_per_step": trajectories * ns.train_steps,
        "dataset_pairs": ns.train_size * ns.train_steps,
        "batches_per_epoch": math.ceil(ns.train_size / trajectories),
        "sym_samples": ns.sym_samples if k else 0,
        "euler_steps": ns.steps,
        "dt": ns.stepsize,
        "mc_samples": ns.mc_samples,
        "hidden": [ns.n_hidden] * (ns.n_layers - 1),
        "act_fun": ns.act_fun,
        "elu_alpha": ELU_ALPHA.get(ns.act_fun),
        "measure_dist": ns.measure_dist,
        "prior_prec_method": ns.prior_prec_method,
        "output_var_method": ns.output_var_method,
        "conserved_init_std": ns.conserved_init_std,
        "lr_param": ns.lr_param,
        "lr_cyper": ns.lr_cyper,
        "n_epochs (cosine schedule)": ns.n_epochs,
    }


def compare_settings(ours: Mapping[str, Any], ref: Mapping[str, Any], variant: str) -> list[str]:
    """Where our side's HNN settings (``timing.py``'s ``HNN`` entry, optionally with ``num_data``, ``elu_alpha``,
    ``prior`` and ``eta_init_std``) differ from the reference's (:func:`settings_of`): one line per difference."""
    p = tuple(ours["particles"])
    checks = [
        ("state dimension M", ours["state_dim"], ref["state_dim"]),
        ("hidden widths", tuple(ours["hidden"]), tuple(ref["hidden"])),
        ("(x, y) pairs per step", ours["batch"], ref["pairs_per_step"]),
        ("(x, y) pairs in the data set", ours.get("num_data", ref["dataset_pairs"]), ref["dataset_pairs"]),
        ("Euler sub-steps E", ours["euler_steps"], ref["euler_steps"]),
        ("dt", ours["dt"], ref["dt"]),
        ("weight samples", ref["mc_samples"] if ref["mc_samples"] in p else p, ref["mc_samples"]),
        ("ELU α", ours.get("elu_alpha", ref["elu_alpha"]), ref["elu_alpha"]),
        ("prior precision", ours.get("prior", PRIOR[ref["prior_prec_method"]]), PRIOR[ref["prior_prec_method"]]),
    ]
    if variant == "learned":
        checks += [
            ("symmetry samples S", ours["num_transforms"], ref["sym_samples"]),
            ("generators K", ours["num_generators"], ref["num_generators"]),
            ("symmetry sampling", ours["sampling"], SAMPLING.get(ref["measure_dist"], ref["measure_dist"])),
            ("generator init std", ours.get("eta_init_std", ref["conserved_init_std"]), ref["conserved_init_std"]),
        ]
    return [f"{name}: ours {a}, reference {b}" for name, a, b in checks if a != b]


def record(
    times: Sequence[float], compile_s: float, loss: float, settings: Mapping[str, Any], **extra: Any
) -> dict[str, Any]:
    """The JSON line this script prints: per-step seconds, their median, the compile seconds, the settings, and
    ``extra`` (system, variant, devices, versions, ...)."""
    return {
        **extra,
        "step_s": [float(t) for t in times],
        "median_s": statistics.median(times) if times else None,
        "compile_s": float(compile_s),
        "timed_steps": len(times),
        "final_loss": loss,
        "settings": dict(settings),
    }


def _no_print(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``jax.debug.print`` inside the reference's step: no host callback."""


def load_reference(ref_dir: Path) -> types.SimpleNamespace:
    """JAX, optax and the reference's modules imported from ``ref_dir``, with ``jax.debug.print`` a no-op before
    anything is traced and an empty ``wandb`` module (``train.py`` imports it; nothing of it is called here)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.modules["wandb"] = types.ModuleType("wandb")
    jax = importlib.import_module("jax")
    jax.debug.print = _no_print
    sys.path.insert(0, str(ref_dir))
    mods = {name: importlib.import_module(name) for name in ("utils", "network", "dynamics", "data", "train")}
    return types.SimpleNamespace(jax=jax, jnp=jax.numpy, optax=importlib.import_module("optax"), **mods)


def make_dynamics(ref: types.SimpleNamespace, name: str) -> Any:
    """The reference's dynamics object for ``--dynamics`` (as ``main.init_dynamics``)."""
    if m := re.fullmatch(r"nbody_(\d+)d_(\d+)b", name):
        return ref.dynamics.Nbody(int(m[1]), int(m[2]))
    if name == "harmonic-oscillator":
        return ref.dynamics.HarmonicOscillator()
    raise ValueError(f"unsupported dynamics {name!r}")


def first_batch(
    ref: types.SimpleNamespace, ns: argparse.Namespace, settings: Mapping[str, Any], dynamics: Any
) -> tuple:
    """(x, y, key): one training batch, x and y of shape (B·T, M), as ``train_model`` forms it from the first B
    trajectories of ``main.py``'s training set, and the key its loop splits next."""
    jax, jnp = ref.jax, ref.jnp
    phase = functools.partial(
        dynamics.initial_phase, q_scale=ns.q_scale, p_scale=ns.p_scale, q_shift=ns.q_shift, p_shift=ns.p_shift
    )
    # on the host CPU (an adaptive ODE solve per trajectory, each of a new closure: small work, many dispatches), in a
    # temporary folder (it writes a cache under ./data), its prints on stderr
    host = jax.default_device(jax.devices("cpu")[0])
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), contextlib.redirect_stdout(sys.stderr), host:
        traj = ref.data.generate_dataset(
            dynamics.H,
            phase,
            f"{ns.dynamics}_train",
            settings["trajectories_per_step"],
            ns.train_steps,
            ns.stepsize,
            seed=ns.seed,
        )
    traj = jnp.asarray(jax.device_get(traj))  # onto the default device
    traj_key, key = jax.random.split(jax.random.PRNGKey(100))  # train_model's keys
    x, y = ref.train.trajectory_to_batches(traj, traj_key, noise_std=jnp.sqrt(ns.output_noise))
    return x, y, key


def build(ref: types.SimpleNamespace, ns: argparse.Namespace, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Model, parameters, optimisers and one training batch as ``main.main`` and ``train.train_model`` build them:
    returns the step's body ``step(state, key) -> (state, key, loss)``, its first state and key."""
    jax, jnp, optax = ref.jax, ref.jnp, ref.optax
    dynamics = make_dynamics(ref, ns.dynamics)
    batch_x, batch_y, key = first_batch(ref, ns, settings, dynamics)

    init_key = jax.random.PRNGKey(100)  # main.py's model key: the weights, then the generators from the same key
    params = ref.network.init_mlp_vi(init_key, dynamics.pdim, ns.n_hidden, 1, ns.n_layers, False, ns.fixed_basis_scale)
    for layer in params:
        if "S" in layer:
            layer["A"], layer["S"] = layer["A"] * ns.init_posterior_scale / 5.0, layer["S"] / 5.0
    k = settings["num_generators"]
    *subkeys, _ = jax.random.split(init_key, k + 1)
    cypers = [dynamics.init_affine_as_subgroup("", key=s, std=ns.conserved_init_std) for s in subkeys]
    hypers = [jnp.float32(1 / ns.init_prior_var) for _ in range(ns.n_layers)] + [jnp.float32(ns.output_var**0.5)]

    def adam(lr: float, offset: int = 0) -> Any:  # train_model's cosine decay over all epochs' batches
        decay = (ns.n_epochs - offset) * settings["batches_per_epoch"]
        return optax.adam(lambda t: lr * (jnp.cos(jnp.pi * t / decay) + 1) * 0.5, b1=ns.beta1, b2=ns.beta2)

    opt_param, opt_cyper = adam(ns.lr_param), adam(ns.lr_cyper, ns.cyper_burnin)
    h_model = functools.partial(
        ref.network.batch_hnn_H,
        *(dynamics.conserved_functions(ns.group), ns.group, None, ns.residual, ns.measure_dist, ns.measure_scale),
        *(ns.sym_samples, ns.sym_over_path, ns.n_layers, ns.act_fun, ns.sym_steps, ns.bch_order, ns.tmp),
    )
    static = (h_model, settings["dataset_pairs"], batch_x, batch_y, ns.steps, 1.0, ns.stepsize)
    flags = dict(map_mean=False, mc_samples=ns.mc_samples, learn_output_var=False, burnin=False)
    flags["learn_prior_prec"] = ns.prior_prec_method == "gradients"

    def step(state: tuple, key: Any) -> tuple:
        params, hypers, cypers, s_param, s_cyper = state
        key, sub = jax.random.split(key)
        (loss, _), (g_param, _, g_cyper) = ref.train.make_vi_step((params, hypers, cypers), sub, *static, **flags)
        update, s_param = opt_param.update(g_param, s_param, params)
        params = optax.apply_updates(params, update)
        update, s_cyper = opt_cyper.update(g_cyper, s_cyper, cypers)
        cypers = optax.apply_updates(cypers, update)
        hypers = list(hypers)  # auto_prior_prec rewrites the list in place
        ref.utils.auto_prior_prec(hypers, params, None, ns.prior_prec_method)
        return (params, hypers, cypers, s_param, s_cyper), key, loss

    assert dynamics.pdim == settings["state_dim"] and batch_x.shape == (settings["pairs_per_step"], dynamics.pdim)
    state = (params, hypers, cypers, opt_param.init(params), opt_cyper.init(cypers))
    return {"step": step, "state": state, "key": key}


def time_steps(
    ref: types.SimpleNamespace,
    built: dict[str, Any],
    update: str,
    warmup: int,
    steps: int,
    ready: Path | None = None,
    go: Path | None = None,
) -> tuple:
    """(compile seconds, per-step seconds, last loss): compiled first (then ``ready`` is created and, where ``go`` is
    given, the steps wait until that file exists; ``built["waited_s"]`` records how long), then ``warmup`` untimed
    and ``steps`` timed steps, each ended by ``block_until_ready``."""
    jax, step, state, key = ref.jax, built["step"], built["state"], built["key"]
    loss, t0 = float("nan"), time.perf_counter()
    if update == "fused":
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        step = jax.jit(step, donate_argnums=0).lower(state, key).compile()
    else:  # as train_model runs it: the first step compiles make_vi_step
        state, key, loss = jax.block_until_ready(step(state, key))
    compile_s, times = time.perf_counter() - t0, []
    if ready is not None:
        ready.touch()
    t1 = time.perf_counter()
    while go is not None and not go.exists():
        time.sleep(0.2)
    built["waited_s"] = time.perf_counter() - t1
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        state, key, loss = jax.block_until_ready(step(state, key))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return compile_s, times, float(loss)


def _versions() -> dict[str, str]:
    out = {}
    for name in ("jax", "jaxlib", "optax", "diffrax", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def _checkout_digest(ref_dir: Path) -> str:
    """Which version of the reference ran: sha256 of its Python files (an archive has no git commit)."""
    h = hashlib.sha256()
    for path in sorted(ref_dir.glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reference-dir", type=Path, required=True, help="a checkout of tychovdo/noethers-razor")
    p.add_argument("--system", choices=list(REFERENCE_ARGS), default="hnn-sho")
    p.add_argument("--variant", choices=VARIANTS, default="learned", help="learned symmetry, or the plain HNN")
    p.add_argument("--update", choices=("fused", "eager"), default="fused", help="one jit, or as train_model runs")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps after compiling (2; smoke 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (20; smoke 3)")
    p.add_argument("--smoke", action="store_true", help="toy sizes (SMOKE_ARGS), for the tests")
    p.add_argument("--dry-run", action="store_true", help="print the settings and exit (no JAX needed)")
    p.add_argument("--ready-file", type=Path, default=None, help="create this file once the step is compiled")
    p.add_argument(
        "--go-file",
        type=Path,
        default=None,
        help="after compiling, wait until this file exists before the steps: the compile can run beside other\n"
        "work and the timing alone (JAX does not cache a step with host callbacks, so it cannot be split in two runs)",
    )
    return p


def main(argv: list[str] | None = None, out: Callable[[str], Any] = print) -> int:
    args = parser().parse_args(argv)
    main_py = args.reference_dir / "main.py"
    if not main_py.exists():
        raise SystemExit(f"{main_py} not found: --reference-dir must be a checkout of tychovdo/noethers-razor")
    ref_argv = reference_argv(args.system, args.variant, args.smoke)
    ns = reference_namespace(main_py, ref_argv)
    settings = settings_of(ns)
    head = {"system": args.system, "variant": args.variant, "update": args.update, "smoke": args.smoke}
    head["reference_argv"] = shlex.join(ref_argv)
    if args.dry_run:
        out(json.dumps({**head, "settings": settings}))
        return 0
    warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 2)
    steps = args.steps if args.steps is not None else (3 if args.smoke else 20)
    ref = load_reference(args.reference_dir.resolve())
    built = build(ref, ns, settings)
    compile_s, times, loss = time_steps(ref, built, args.update, warmup, steps, args.ready_file, args.go_file)
    jax = ref.jax
    env = {k: os.environ[k] for k in ("JAX_PLATFORMS", "XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE") if k in os.environ}
    extra = {
        **head,
        "warmup_steps": warmup,
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "versions": _versions(),
        "env": env,
        "debug_print": "disabled (no-op before tracing)",
        "waited_s": built.get("waited_s", 0.0),
        "reference_digest": _checkout_digest(args.reference_dir),
    }
    out(json.dumps(record(times, compile_s, loss, settings, **extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
