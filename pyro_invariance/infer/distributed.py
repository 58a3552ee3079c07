"""Data-parallel SVI across processes and GPUs: shards, ranks, and one RNG stream per shard.

**Shards.** With ``FitConfig.shards = W`` a step of :func:`~pyro_invariance.infer.training.fit` splits
its global minibatch of B rows (drawn by the same seeded shuffler in every process) into W
contiguous shards of b = B/W rows. Shard s draws its weight and symmetry samples from a random
stream of its own (:class:`ShardStreams`: a torch generator state seeded by ``(seed, s)``, swapped in
for the shard's loss and saved in checkpoints), and its loss is Pyro's ELBO on its rows with the
likelihood scaled by N/b (paper 003, Eq. 10 on a minibatch)::

    L_s = −(N/b) Σ_{n∈shard s} log p(y_n | x_n, θ_s, η) + KL(q(θ) ‖ p(θ)),   θ_s ~ q  (stream s)

The step minimises the mean ``(1/W) Σ_s L_s``: an unbiased estimate of −ELBO (the same expectation as
one B-row minibatch with one draw), with W weight draws per step instead of one.

**Processes.** P processes (ranks of a ``torch.distributed`` process group, e.g. started by
``torchrun``; ``FitConfig.strategy = "ddp"``) split the W shards: rank r computes shards
``r·W/P … (r+1)·W/P − 1`` one after another, and PyTorch's ``DistributedDataParallel`` (around Pyro's
``ELBOModule``) averages the gradients over the ranks, so every rank takes the same Adam step. As the
shards, their rows and their streams do not depend on P, a run computes the same numbers on any P
that divides W: bit-for-bit on the same P (CPU; CUDA with
:func:`~pyro_invariance.infer.training.make_deterministic`), and to float rounding (the order in
which the gradient sums are added) on another P — e.g. 2 ranks vs 1 process with ``shards=2``.
``shards=1`` in one process is the run of before (the global stream, no swap).

**Reductions** outside the step: the history's losses are averaged over ranks at each bulk read;
the Laplace curvature sums (:meth:`Ranks.rows`, :meth:`Ranks.sum`) and the evidence bounds'
log weights (:meth:`Ranks.cat`) are reduced in the functions that compute them.

Only the torch CPU/CUDA generators are swapped per shard: Pyro draws from them. Python's and
NumPy's generators stay global (one per process, the same on every rank).

**Endings under torchrun.** A worker that stops with an error writes its one-line reason to the
file torchrun names in ``TORCHELASTIC_ERROR_FILE`` (:func:`record_failure`), which torchrun shows as
the "Root Cause" of its failure summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = [
    "Ranks",
    "ShardStreams",
    "STRATEGIES",
    "current_ranks",
    "launch_rank",
    "record_failure",
    "setup_ranks",
    "under_torchrun",
]

T = TypeVar("T")

#: ``FitConfig.strategy``: one process, or data-parallel ranks of a torch.distributed process group.
STRATEGIES = ("single", "ddp")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of a data-parallel run (``world == 1``: one process)."""

    rank: int = 0
    world: int = 1
    ddp: bool = False  # inside a torch.distributed process group (even with world == 1)

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0, which writes checkpoints and shows progress."""
        return self.rank == 0

    def own_shards(self, shards: int) -> range:
        """The shard indices this rank computes (``shards`` must be a multiple of ``world``)."""
        per = shards // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def agree(self, error: str | None) -> str | None:
        """Every rank's ``error`` (a message or None) gathered: the first one found on any rank, on
        every rank — so that all ranks raise together instead of some waiting in a collective."""
        if not self.ddp:
            return error
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, error)
        return next((f"rank {r}: {e}" for r, e in enumerate(gathered) if e is not None), None)

    def together(self, fn: Callable[[], T]) -> T:
        """``fn()`` on every rank; when it raises on any rank, every rank raises (the failing rank its
        own exception, the others a ``RuntimeError`` naming it) instead of some ranks waiting for the
        others in a collective. On one process: ``fn()``."""
        if not self.ddp:
            return fn()
        error: Exception | None = None
        out = None
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
            error = exc
        message = self.agree(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        if message is not None:
            raise RuntimeError(f"data-parallel run stopped: {message}")
        return out  # type: ignore[return-value]

    def mean(self, t: Tensor) -> Tensor:
        """``t`` averaged over the ranks (a copy; ``t`` itself on one process)."""
        if not self.ddp:
            return t
        out = t.clone()
        torch.distributed.all_reduce(out)
        return out / self.world

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` is set on any rank."""
        if not self.ddp:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        if not self.ddp:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def sum(self, t: Tensor) -> Tensor:
        """``t`` summed over the ranks, in place (``t`` itself on one process)."""
        if self.ddp:
            torch.distributed.all_reduce(t)
        return t

    def cat(self, t: Tensor) -> Tensor:
        """The ranks' 1-d tensors concatenated in rank order (lengths may differ)."""
        if not self.ddp:
            return t
        return torch.cat([part.to(t.device) for part in self.gather(t.detach().cpu())])

    def rows(self, n: int) -> slice:
        """This rank's contiguous part of ``n`` rows (sizes differ by at most one)."""
        start = self.rank * n // self.world
        return slice(start, (self.rank + 1) * n // self.world)


def current_ranks() -> Ranks:
    """The ranks of the active ``torch.distributed`` process group, or one process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size(), True)
    return Ranks()


def setup_ranks(strategy: str, device: str) -> tuple[Ranks, str]:
    """The ranks and this process's device for ``strategy``.

    ``"single"``: one process on ``device``. ``"ddp"``: the active process group, or one initialised
    from the environment that ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), with the ``nccl`` backend on CUDA and ``gloo`` on the CPU; ``device="cuda"``
    becomes ``cuda:<LOCAL_RANK>``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {list(STRATEGIES)}")
    if strategy == "single":
        return Ranks(), device
    if not torch.distributed.is_available():
        raise RuntimeError("strategy='ddp' needs torch.distributed, which this torch build lacks")
    if not torch.distributed.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"strategy='ddp' needs a torch.distributed process group: start the script with torchrun "
                f"(e.g. torchrun --nproc-per-node 2 ...) or call torch.distributed.init_process_group "
                f"first ({', '.join(missing)} not set)"
            )
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    ranks = current_ranks()
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", ranks.rank % max(1, torch.cuda.device_count())))
        device = f"cuda:{local}"
        torch.cuda.set_device(device)  # object collectives under NCCL use the current device
    return ranks, device


#: where torchrun's elastic agent reads a failed worker's reason (one file per worker)
ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"


def under_torchrun() -> bool:
    """Whether this process is a worker started by ``torchrun`` (its agent names an error file)."""
    return bool(os.environ.get(ERROR_FILE_VARIABLE))


def launch_rank() -> int:
    """This process's rank: in the active process group, else the ``RANK`` torchrun set (an error
    before the group exists is still known to come from rank r), else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    if not under_torchrun():  # a RANK left in the shell by something else does not make this a worker
        return 0
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def record_failure(message: str) -> bool:
    """Write ``message`` to the error file of a ``torchrun`` worker, in the layout of torch's
    ``ErrorHandler`` without a traceback, so that torchrun's failure summary ("Root Cause") shows
    the message itself. Returns whether it was written (``False`` outside torchrun)."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return False
    data = {"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)
    except OSError:
        return False
    return True


def _shard_seed(seed: int, shard: int) -> int:
    return (seed * 1_000_003 + 7_654_321 * (shard + 1)) % (2**63 - 1)


class ShardStreams:
    """One random stream per shard (CPU generator state, plus the CUDA one on a CUDA device).

    ``with streams.stream(s):`` makes shard ``s``'s stream the global torch stream (Pyro samples
    from it) and keeps its advanced state afterwards; the global stream is restored. All W states
    travel in checkpoints (:meth:`state`, gathered from the ranks that own them).
    """

    def __init__(self, shards: int, seed: int, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.states: list[list[Tensor]] = [self._seeded(_shard_seed(seed, s)) for s in range(shards)]

    def _devices(self) -> list[Any]:
        return [self.device] if self.cuda else []

    def _seeded(self, seed: int) -> list[Tensor]:
        with torch.random.fork_rng(devices=self._devices()):
            torch.manual_seed(seed)
            return self._current()

    def _current(self) -> list[Tensor]:
        states = [torch.get_rng_state()]
        if self.cuda:
            states.append(torch.cuda.get_rng_state(self.device))
        return states

    @contextlib.contextmanager
    def stream(self, shard: int) -> Iterator[None]:
        """Shard ``shard``'s stream as the global torch stream inside the block."""
        with torch.random.fork_rng(devices=self._devices()):
            torch.set_rng_state(self.states[shard][0])
            if self.cuda:
                torch.cuda.set_rng_state(self.states[shard][1], self.device)
            yield
            self.states[shard] = self._current()

    def state(self, ranks: Ranks) -> list[list[Tensor]]:
        """Every shard's state, each taken from the rank that owns the shard (a collective under DDP)."""
        own = set(ranks.own_shards(len(self.states)))
        mine = {s: [t.cpu() for t in self.states[s]] for s in own}
        merged: dict[int, list[Tensor]] = {}
        for part in ranks.gather(mine):
            merged.update(part)
        return [merged[s] for s in range(len(self.states))]

    def load(self, states: Sequence[Sequence[Tensor]]) -> None:
        if len(states) != len(self.states):
            raise ValueError(f"the checkpoint has {len(states)} shard streams, this run {len(self.states)}")
        self.states = [[t.clone() for t in st] for st in states]

    def copy_states(self) -> list[list[Tensor]]:
        return [[t.clone() for t in st] for st in self.states]
