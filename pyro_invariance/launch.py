"""Data-parallel CLI runs that end like one-process runs: torchrun, with the CLI's exit codes.

The launcher::

    python -m pyro_invariance.launch --nproc-per-node 2 fit --model invariant-mlp --data digits \\
        --strategy ddp --shards 2 --out results/ddp

is ``torchrun --nproc-per-node 2 -m pyro_invariance.cli fit ...``: torch's own launcher (its options,
its elastic agent, run in this process) starting the CLI on every rank. Only the ending differs.
torchrun itself exits 1 whatever its workers did, and on Ctrl-C or SIGTERM it prints a
``SignalException`` traceback; this launcher exits as the one-process CLI does:

* **Ctrl-C / SIGTERM**: torchrun passes the signal on to the ranks, which stop together at their next
  bulk read (every ``log_every`` steps) and write the checkpoint; rank 0 prints ``interrupted at step
  k; checkpoint at PATH; continue with ...``; the launcher exits 130 / 143, no traceback. torchrun
  waits 30 s for the ranks before it kills them, so ``log_every`` steps must take less than that.
* **an error**: rank 0 printed the one-line reason (naming the rank it came from); the launcher exits
  with the failing rank's exit code (2 for an error in the input) instead of torchrun's 20-line
  failure summary. A failure rank 0 did not see (a rank killed, or an error outside a step the ranks
  check together) is printed in one line from the rank's error file.

Under plain ``torchrun`` the ranks behave the same (one message, rank 0; every failing rank's reason
in the "Root Cause" of torchrun's summary), but the exit code and the traceback are torchrun's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

#: the module every rank runs
ENTRY = "pyro_invariance.cli"

#: torchrun's log lines that this launcher's ending replaces (the exit code and rank 0's message say the
#: same); its other warnings, e.g. that a rank had to be killed after 30 s, are kept
_ROUTINE_LOGS = ("Received %s death signal", "Sending process %s closing signal", "failed (exitcode: %s)")


class _QuietRoutine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ROUTINE_LOGS)


def _quiet_routine_logs() -> None:
    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_QuietRoutine())


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser, whose script argument is the CLI's command and its options."""
    parser = torchrun.get_args_parser()
    parser.prog = "python -m pyro_invariance.launch"
    parser.description = (
        "torchrun's options, then a pyro-invariance command and its options; "
        "exits as the one-process CLI does (130 / 143 when interrupted, 2 for an input error)"
    )
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public way to rename a positional
        if action.dest == "training_script":
            action.metavar, action.help = "COMMAND", "a pyro-invariance command (fit, evaluate, compare, demo, list)"
        elif action.dest == "training_script_args":
            action.metavar, action.help, action.required = "OPTIONS", "the command's options", False
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """torchrun's settings for running ``python -m pyro_invariance.cli COMMAND ...`` on every rank."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.module or args.no_python:
        parser.error(f"--module and --no-python do not apply: the ranks run python -m {ENTRY}")
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.training_script, args.module = ENTRY, True
    return args


def _recorded(failure: ProcessFailure) -> bool:
    """Whether the rank wrote its reason to its error file (then it also printed it, if rank 0)."""
    return os.path.isfile(failure.error_file)


def _exit_code(failure: ProcessFailure) -> int:
    """A rank's exit status as a shell reports it (a rank killed by signal s: 128 + s)."""
    return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode


def _reason(rank: int, failure: ProcessFailure) -> str:
    """One line for a failure rank 0 did not report: the rank's recorded message, or how it ended."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    line = str(message).strip().splitlines()[0] if _recorded(failure) and str(message).strip() else ""
    if line.startswith("pyro-invariance: "):
        line = line[len("pyro-invariance: ") :]
    if failure.exitcode < 0:
        line = line or f"killed by {failure.signal_name()}"
    return f"pyro-invariance: rank {rank}: {line or f'exited with code {failure.exitcode}'}"


def _ended(exc: ChildFailedError) -> int:
    """The exit code of a run some rank failed; prints the failure in one line when rank 0 did not."""
    rank, root = exc.get_first_failure()
    zero = exc.failures.get(0)
    if zero is None or not _recorded(zero):  # rank 0 printed nothing: say what happened
        print(_reason(rank, root), file=sys.stderr)
    return _exit_code(root)


def main(argv: Sequence[str] | None = None) -> int:
    """Launch the CLI on the ranks (see module docstring); returns the exit code."""
    args = parse_args(argv)
    _quiet_routine_logs()
    try:
        torchrun.run(args)
    except SignalException as exc:  # the ranks have stopped (rank 0 said where); exit as the CLI does
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        return _ended(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
