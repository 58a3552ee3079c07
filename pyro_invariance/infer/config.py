"""One configuration for training: :class:`FitConfig`, shared by the API and the CLI.

``fit``, ``fit_laplace`` and ``compare_guides`` take ``config=None, **overrides``, where the
overrides are :class:`FitConfig` field names. The settings of a run are resolved once, with this
precedence (highest first):

1. what the caller gives explicitly — a whole ``config`` (taken as it is), then ``**overrides``;
2. the model's recommended settings, ``model.fit_defaults`` (e.g. the layer-wise networks' rates,
   without which they collapse);
3. the guide's recommended settings, ``guide.fit_defaults`` (e.g. the full-rank guide's
   covariance-factor rate);
4. the library defaults below.

:meth:`FitConfig.recommended` shows what a run would use; :func:`add_config_arguments` generates
the CLI options (``--steps``, ``--lr`` ...) from the same fields, so the settings are listed once.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pyro_invariance.guides.base import CatalogueGuide
from pyro_invariance.infer.distributed import STRATEGIES
from pyro_invariance.infer.fast_step import LEAN_ELBOS
from pyro_invariance.models.base import CatalogueModel
from pyro_invariance.validation import check_device, check_positive_float, check_positive_int, check_seed

#: The built-in ``FitConfig.elbo`` names (the CLI's choices); ``fit`` also takes the names that
#: :func:`~pyro_invariance.infer.fast_step.register_elbo` adds.
ELBOS = ("meanfield", "trace", "iwae", "rws")
SCHEDULES = ("cosine", "constant")
#: ``FitConfig.validation``: Pyro's validation on the first step of each ``fit`` call, or on every step.
VALIDATIONS = ("first-step", "always")
#: ``FitConfig.compile`` (``True`` means ``"inductor"``, ``False`` ``"off"``).
COMPILE_MODES = ("auto", "off", "capture", "inductor", "cudagraphs")
#: the modes that compute the numbers of eager Pyro (and so may run with shards or validation on every step)
_EAGER_NUMBERS = ("auto", "off")


def _opt(default: Any, help: str, **cli: Any) -> Any:
    return field(default=default, metadata={"help": help, **cli})


def _batch_size(text: str) -> int | None:
    """CLI type of ``--batch-size``: a positive integer, or ``full`` for the whole data set."""
    if text.strip().lower() in ("full", "none", "all"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'full', got {text!r}") from None


@dataclass
class FitConfig:
    """Settings of a run (all of them are saved with checkpoints and results).

    Learning rates are those of Adam's parameter groups (``step_loop.param_groups``): the guide's
    means and scales (``lr``), its off-diagonal covariance factors (``factor_lr``), the symmetry
    parameters η (``eta_lr``) and the model's other point estimates (``model_lr``, default ``lr``).

    ``shards`` splits each minibatch into shards with a weight draw and a random stream each (it
    changes the numbers: part of the fingerprint when > 1); ``strategy="ddp"`` runs them on the ranks
    of a ``torch.distributed`` process group (the same numbers on any number of ranks dividing
    ``shards``, up to float rounding; left out of the fingerprint). See
    :mod:`pyro_invariance.infer.distributed`.

    The last four fields set how fast a step runs, not what it computes
    (:mod:`pyro_invariance.infer.fast_step`): ``validation``, ``compile`` (``"auto"`` and ``"capture"``
    give the same numbers as ``"off"``; ``"inductor"`` other random draws), ``log_every`` and ``tf32`` (CUDA only).
    ``validation`` and ``log_every`` may differ between a run and its resumption (they are left out
    of the run's fingerprint); ``compile="inductor"`` and ``tf32=True`` are part of it. ``threads``
    sets torch's thread count for the call (restored after it returns); a thread count given is part
    of the fingerprint, since other counts may round sums differently.
    """

    steps: int = _opt(1000, "total SVI steps (the cosine schedule spans them)", type=int)
    batch_size: int | None = _opt(128, "minibatch size B, or 'full'; the likelihood is scaled by N/B", type=_batch_size)
    batch_group: int | None = _opt(
        None,
        "rows per group: minibatches of whole groups of consecutive rows (e.g. the T pairs of one trajectory), "
        "the groups shuffled; default: rows shuffled one by one",
        type=int,
    )
    lr: float = _opt(5e-2, "Adam rate of the guide's means and scales", type=float)
    eta_lr: float = _opt(1e-1, "Adam rate of the symmetry parameters η", type=float)
    model_lr: float | None = _opt(None, "Adam rate of the model's other point estimates (default: lr)", type=float)
    factor_lr: float = _opt(1e-3, "Adam rate of the guide's off-diagonal covariance factors", type=float)
    num_particles: int = _opt(1, "Monte-Carlo samples of the ELBO per step", type=int)
    elbo: str = _opt(
        "meanfield",
        "meanfield: analytic KL where registered; trace: Monte-Carlo KL; iwae: the importance-weighted "
        "bound over num_particles draws (Burda et al. 2016); rws: reweighted wake-sleep, the IWAE bound for the model "
        "and the inclusive KL(p || q) for the guide (mass-covering; Le et al. 2019)",
        choices=ELBOS,
    )
    schedule: str = _opt("cosine", "learning-rate schedule: cosine (to 0) or constant", choices=SCHEDULES)
    seed: int = _opt(0, "seeds Pyro/torch, the minibatch shuffler and hence the whole run (0 to 2**32-1)", type=int)
    device: str = _opt(
        "cpu",
        "cpu, or cuda / cuda:N / mps where this machine has them: model, guide and data are moved there",
        type=str,
    )
    shards: int = _opt(
        1,
        "shards of each minibatch, each with its own weight draw and random stream; the loss is their "
        "mean (pyro_invariance.infer.distributed). The processes of a DDP run split them",
        type=int,
    )
    strategy: str = _opt(
        "single",
        "single: one process; ddp: data-parallel ranks of a torch.distributed process group "
        "(torchrun), which split the shards and average gradients with DistributedDataParallel",
        choices=STRATEGIES,
    )
    validation: str = _opt(
        "first-step",
        "Pyro's validation checks: on for the first step of a call, then off "
        "('first-step'; divergence is still caught, see fit), or on every step with a host check of the "
        "loss after each step ('always', the slow path)",
        choices=VALIDATIONS,
    )
    compile: str = _opt(
        "auto",
        "auto: capture where the model declares it safe, the call runs enough steps and the replay equals Pyro's "
        "to the bit, else off (pyro_invariance.infer.auto_compile); off: eager Pyro; capture: replay the loss "
        "from a captured graph (same numbers, checked against Pyro's); inductor: torch.compile that graph "
        "(CUDA graphs on a GPU; other random draws); cudagraphs: "
        "that graph's forward and backward recorded as CUDA graphs (CUDA only; other random draws)",
        choices=COMPILE_MODES,
    )
    log_every: int = _opt(
        50,
        "steps between bulk reads of the loss history (and, with validation 'first-step', "
        "snapshots of the state for locating a divergence)",
        type=int,
    )
    tf32: bool = _opt(
        False,
        "TF32 float32 matmuls and convolutions on CUDA (ignored with a warning elsewhere)",
        action=argparse.BooleanOptionalAction,
    )
    threads: int | None = _opt(
        None,
        "torch threads while the call runs (restored after; default: leave torch's count). "
        "One is usually fastest for these small models, above all on a shared machine",
        type=int,
    )

    def __post_init__(self) -> None:
        if self.compile is True or self.compile is False:  # compile=True: torch.compile (the spelling)
            self.compile = "inductor" if self.compile else "off"

    def validate(self) -> FitConfig:
        """Check every field; returns ``self`` (raises ``ValueError`` naming the field).

        Numbers must be numbers (``lr="0.1"`` is refused, not converted), seeds lie in
        ``0 … 2**32 − 1`` (:func:`~pyro_invariance.validation.check_seed`) and ``device`` must exist on
        this machine (:func:`~pyro_invariance.validation.check_device`, a ``DeviceError``).
        """
        check_positive_int("steps", self.steps)
        if self.batch_size is not None:
            check_positive_int("batch_size", self.batch_size)
        if self.batch_group is not None:
            check_positive_int("batch_group", self.batch_group)
            if self.batch_size is not None and self.batch_size % self.batch_group:
                raise ValueError(
                    f"batch_size={self.batch_size} is not a multiple of batch_group={self.batch_group}: a minibatch "
                    "holds whole groups"
                )
        check_positive_float("lr", self.lr)
        check_positive_float("eta_lr", self.eta_lr)
        if self.model_lr is not None:
            check_positive_float("model_lr", self.model_lr)
        check_positive_float("factor_lr", self.factor_lr)
        check_positive_int("num_particles", self.num_particles)
        if self.elbo not in LEAN_ELBOS:
            raise ValueError(f"unknown elbo {self.elbo!r}; use one of {list(LEAN_ELBOS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        check_seed(self.seed)
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string such as 'cpu' or 'cuda', got {self.device!r}")
        check_device(self.device)
        if self.validation not in VALIDATIONS:
            raise ValueError(f"unknown validation {self.validation!r}; use one of {list(VALIDATIONS)}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"unknown compile {self.compile!r}; use one of {list(COMPILE_MODES)} (or True / False)")
        check_positive_int("shards", self.shards)
        if self.batch_size is not None and self.batch_size % self.shards:
            raise ValueError(
                f"batch_size={self.batch_size} is not a multiple of shards={self.shards}: every shard needs "
                "the same number of rows"
            )
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; use one of {list(STRATEGIES)}")
        if self.compile not in _EAGER_NUMBERS and (self.shards > 1 or self.strategy == "ddp"):
            raise ValueError(
                f"compile={self.compile!r} needs shards=1 and strategy='single': a captured graph replays "
                "one stream on one process"
            )
        check_positive_int("log_every", self.log_every)
        if self.threads is not None:
            check_positive_int("threads", self.threads)
        if not isinstance(self.tf32, bool):
            raise ValueError(f"tf32 must be True or False, got {self.tf32!r}")
        if self.compile not in _EAGER_NUMBERS and self.validation == "always":
            raise ValueError(
                f"compile={self.compile!r} needs validation='first-step': validation reads tensor values on "
                "every step, which a captured graph cannot"
            )
        return self

    @classmethod
    def names(cls) -> list[str]:
        """The field names, in order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def check_names(cls, settings: Mapping[str, Any], what: str = "fit setting") -> None:
        """Refuse keys that are not fields (one line listing the fields)."""
        unknown = sorted(set(settings) - set(cls.names()))
        if unknown:
            raise TypeError(
                f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"FitConfig has {', '.join(cls.names())}"
            )

    @classmethod
    def recommended(cls, model: Any = None, guide: Any = None, **overrides: Any) -> FitConfig:
        """Library defaults, updated by the guide's then the model's ``fit_defaults``, then ``overrides``."""
        settings: dict[str, Any] = {}
        for source, what in (
            (fit_defaults_of(guide), "guide fit_defaults"),
            (fit_defaults_of(model), "model fit_defaults"),
            (overrides, "fit setting"),
        ):
            cls.check_names(source, what)
            settings.update(source)
        if "device" in settings:
            settings["device"] = str(settings["device"])
        return cls(**settings).validate()

    def replace(self, **changes: Any) -> FitConfig:
        """A copy with ``changes`` (field names), validated."""
        self.check_names(changes)
        if "device" in changes:
            changes["device"] = str(changes["device"])
        return dataclasses.replace(self, **changes).validate()


def fit_defaults_of(obj: Any) -> Mapping[str, Any]:
    """The settings a catalogue model or guide recommends (its ``fit_defaults``); ``{}`` for other objects."""
    if isinstance(obj, (CatalogueModel, CatalogueGuide)):
        return dict(obj.fit_defaults)
    return {}


def resolve_config(config: FitConfig | None, model: Any, guide: Any, overrides: Mapping[str, Any]) -> FitConfig:
    """The settings of a run: ``config`` (as given) or :meth:`FitConfig.recommended`, then ``overrides``."""
    if config is None:
        return FitConfig.recommended(model, guide, **overrides)
    if not isinstance(config, FitConfig):
        raise TypeError(f"config must be a FitConfig or None, got {type(config).__name__}")
    return config.replace(**overrides)


# ----------------------------------------------------------------------------------------------
# The CLI's options, generated from the fields
# ----------------------------------------------------------------------------------------------


def add_config_arguments(
    parser: argparse.ArgumentParser, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> argparse.ArgumentParser:
    """Add ``--<field>`` for every :class:`FitConfig` field (not in ``skip``; in ``only`` when given) to ``parser``.

    An option the user does not give is absent from the parsed namespace (``argparse.SUPPRESS``),
    so the model's and the guide's recommended settings apply (:func:`config_overrides`).
    """
    group = parser.add_argument_group(
        "training settings (FitConfig; default: the model's, then the guide's, then the library's)"
    )
    for f in fields(FitConfig):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        meta = dict(f.metadata)
        default = f.default if f.default is not None else "—"
        kwargs: dict[str, Any] = {
            "help": f"{meta.pop('help')} (library default: {default})",
            "default": argparse.SUPPRESS,
        }
        if "type" in meta:
            kwargs["type"] = meta.pop("type")
        kwargs.update(meta)
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    return parser


def config_parent(skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """An argparse parent parser holding the :class:`FitConfig` options (those in ``only`` when given)."""
    return add_config_arguments(argparse.ArgumentParser(add_help=False), skip, only)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`FitConfig` settings the user gave on the command line."""
    return {name: getattr(args, name) for name in FitConfig.names() if hasattr(args, name)}


__all__: list[str] = [
    "FitConfig",
    "add_config_arguments",
    "config_overrides",
    "config_parent",
    "fit_defaults_of",
    "resolve_config",
]
