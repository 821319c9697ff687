"""Runs that scale out: one process group per command under ``torchrun`` or ``accelerate launch``.

:func:`process_group` initialises ``torch.distributed`` from the environment both launchers set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``; MPI launchers' ``PMI_*``/``OMPI_COMM_WORLD_*``
also work), with gloo on CPU and gloo for CPU tensors + NCCL for CUDA tensors when CUDA is present, and puts
each process on its local GPU. The library shards its data passes whenever a group is up (``calibrate``,
the analyses, probe features); the CLI wraps each streaming command in :func:`scale_out`.

Failures: every collective the commands make between ranks is an :func:`exchange` (an ``all_gather_object``
of ``(error, payload)``), so a rank that fails anywhere takes part in exactly one more exchange, carrying its
error, and every other rank raises :class:`RemoteFailure` from its next exchange instead of hanging.
:func:`shared_failures` does that for a block; :func:`scale_out` for a whole command. Rank 0 alone writes
outputs (:func:`is_main_process`); the command's last exchange is the barrier after it wrote, so all ranks
exit together with the same status. A failed command also ends with an exchange, after rank 0 said the error:
the launcher stops every process once one exits, and rank 0 must not be stopped before it said what failed.

Nothing here imports torch at module level (``papa-surgery --help`` stays fast).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import sys
from collections.abc import Callable, Iterator

from .failures import RemoteFailure, exit_status, is_usage_error, one_line, report
from .outputs.signals import end_on_signals

logger = logging.getLogger("papa_surgery")

RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
WORLD_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
_SHARED = "_papa_shared_failure"  # set on an exception every rank already knows about


def _env_int(names: tuple[str, ...], default: int | None = None) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def launched_world() -> int:
    """How many processes the launcher started (``WORLD_SIZE`` or an MPI equivalent; 1 without a launcher)."""
    return _env_int(WORLD_VARS, 1) or 1


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank() -> int:
    """This process's rank in the running group (0 without one)."""
    dist = _dist()
    return dist.get_rank() if dist else 0


def world_size() -> int:
    """Processes in the running group (1 without one); recorded as ``processes`` in provenance."""
    dist = _dist()
    return dist.get_world_size() if dist else 1


def is_main_process() -> bool:
    """Whether this process writes outputs and shows progress (rank 0, or no group)."""
    return rank() == 0


def backend() -> str:
    """gloo on a CPU-only machine; gloo for CPU tensors and NCCL for CUDA tensors when CUDA is present."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def process_group() -> Iterator[int]:
    """Initialise ``torch.distributed`` from the launcher's environment for the block; yields the world size.

    Without a launcher (or with one process) nothing is initialised and the block runs as a single process.
    A group the caller already started is used as it is and left running.
    """
    import torch
    import torch.distributed as dist

    world = launched_world()
    _warn_single_accelerate_cpu(world)
    if world <= 1 or not dist.is_available() or dist.is_initialized():
        yield world_size()
        return
    rank_ = _env_int(RANK_VARS, 0)
    os.environ.setdefault("RANK", str(rank_))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        raise RuntimeError(
            f"{world} processes but no MASTER_PORT in the environment: start the run with torchrun or "
            "accelerate launch (see README, 'Scaling out')"
        )
    chosen = backend()
    if "nccl" in chosen:
        torch.cuda.set_device(_env_int(LOCAL_RANK_VARS, 0))  # "cuda" then means this process's GPU
    dist.init_process_group(chosen, init_method="env://", rank=rank_, world_size=world)
    try:
        yield world
    finally:
        dist.destroy_process_group()
        # Free the group now, while the interpreter is alive: a gloo group still referenced (from a reference
        # cycle) when the interpreter shuts down can abort the process ("terminate called without an active
        # exception", pytorch/pytorch#190489).
        gc.collect()


def _warn_single_accelerate_cpu(world: int) -> None:
    # `accelerate launch --cpu --num_processes N` without --mpirun_hostfile starts ONE process (its simple
    # launcher); it sets MASTER_PORT but no WORLD_SIZE. Say so rather than silently run single.
    if world <= 1 and os.environ.get("ACCELERATE_USE_CPU") and os.environ.get("MASTER_PORT"):
        logger.warning(
            "accelerate launch --cpu started a single process (it needs --mpirun_hostfile for more); for N CPU "
            "processes use `accelerate launch --multi_gpu --num_processes N ...` (gloo on CPU) or torchrun"
        )


# ------------------------------------------------------------------------------------------ exchanges
def _shared(err: BaseException) -> BaseException:
    setattr(err, _SHARED, True)
    return err


def exchange(payload=None, error: BaseException | None = None) -> list:
    """Every rank's ``payload``, in rank order (``[payload]`` without a group).

    Raises :class:`RemoteFailure` (or re-raises ``error`` on the rank that passed it) when any rank passed
    an error: all ranks raise from the same exchange.
    """
    dist = _dist()
    if dist is None:
        if error is not None:
            raise error
        return [payload]
    message = None if error is None else one_line(error)
    gathered: list = [None] * dist.get_world_size()
    usage = error is not None and is_usage_error(error)
    dist.all_gather_object(gathered, (message, usage, payload))
    if error is not None:
        raise _shared(error)
    for source, (msg, remote_usage, _) in enumerate(gathered):
        if msg is not None:
            raise _shared(RemoteFailure(source, len(gathered), msg, remote_usage))
    return [p for _, _, p in gathered]


def agree() -> None:
    """A barrier that fails on every rank if any rank brings an error (see :func:`shared_failures`)."""
    exchange()


def broadcast_from_main(value):
    """Rank 0's ``value`` on every rank (through an :func:`exchange`, so failures propagate)."""
    return exchange(value if is_main_process() else None)[0]


@contextlib.contextmanager
def shared_failures() -> Iterator[None]:
    """A failure inside the block reaches every rank: the failing rank sends its error at its next exchange.

    On success the block ends with a barrier (:func:`agree`). Interrupts and signals are not exchanged (the
    launcher stops every process).
    """
    if _dist() is None:
        yield
        return
    try:
        yield
    except Exception as err:
        if not getattr(err, _SHARED, False):
            exchange(error=err)  # raises err itself, marked as shared
        raise
    agree()


def on_main(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on rank 0 only (the others get ``None``), once every rank got here without error.

    Every rank must call it at the same point: it starts with an :func:`agree`, so rank 0 writes only
    what all processes finished; a failure of the write itself reaches the others at their next exchange.
    """
    agree()
    return fn(*args, **kwargs) if is_main_process() else None


# ------------------------------------------------------------------------------------------ the CLI
def scale_out(command: Callable) -> Callable:
    """Decorate a click command (``ctx`` first) so it runs as one process of a launched group.

    Rank 0 shows progress, prints and writes; the others are quiet. An error on any rank ends every rank:
    rank 0 prints it (naming the process) and all exit with its status (1, or 2 for bad usage).
    """

    @functools.wraps(command)
    def run(ctx, *args, **kwargs):
        code = _run_rank(ctx, command, args, kwargs)
        if launched_world() > 1:
            _leave(code)  # every output is written and closed: skip the interpreter's teardown (see _leave)
        if code:
            sys.exit(code)

    return run


def _run_rank(ctx, command: Callable, args, kwargs) -> int:
    """Run the command as this process of the group; the exit status (one process raises its own errors).

    In a group, rank 0 says a failed run's error before any process leaves: the launcher stops the other
    processes as soon as one exits, which would cut rank 0 off before it said what went wrong. Once it is
    said, that stop (SIGTERM) ends a process silently with the run's status instead of as a second error.
    """
    with process_group():
        main = is_main_process()
        if not main:
            _quiet_rank(ctx)
        try:
            with shared_failures(), _silenced(not main):
                command(ctx, *args, **kwargs)
            return 0
        except Exception as err:
            if _dist() is None:
                raise  # one process: the command line reports it
            verbose = bool(ctx.obj.get("verbose"))
            code = report(err, verbose) if main or verbose else exit_status(err)  # rank 0 speaks for the run
            # Said: the launcher's SIGTERM, sent once any process exits, now ends this one without a word.
            end_on_signals(code)
            _after_report()
            return code


def _after_report() -> None:
    """Every rank waits here until rank 0 has said the run's error (all ranks fail from the same exchange)."""
    try:
        agree()
    except Exception:  # a peer that is gone (killed, or its connection lost): nothing left to wait for
        pass


def _leave(code: int) -> None:
    """End a launched process now, with ``code``, once its work is done and its outputs are closed.

    Under a launcher the interpreter's teardown can abort a process whose group is already destroyed
    ("terminate called without an active exception", SIGABRT: a c10d/gloo thread still joinable when C++
    static objects are destroyed), and the launcher then reports a failed run after a complete one. Nothing
    of ours needs the teardown: finalizers run here (temporary folders), logs and streams are flushed.
    """
    gc.collect()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _quiet_rank(ctx) -> None:
    """Ranks other than 0 show no bars, warnings or output: rank 0 speaks for the run."""
    import warnings

    ctx.obj["quiet"] = True
    logging.getLogger().setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"


@contextlib.contextmanager
def _silenced(quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield
