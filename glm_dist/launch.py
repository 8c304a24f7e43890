"""``glm launch``: torchrun with defaults for a workstation, and the per-node launcher under SLURM.

    glm launch train -c CONFIG [key=value ...]                  # one node: --standalone, one process
                                                                #   per visible GPU (or --nproc-per-node CPU processes)
    glm launch --nnodes 4 --rdzv-endpoint node1:29500 --rdzv-id JOB train -c CONFIG   # one node of many

Two things plain torchrun does not do, needed for preemption: SIGUSR1 to the launcher is passed
on to its workers instead of killing it (SLURM's ``--signal`` reaches every process of the job,
a workstation user signals just this one; the workers checkpoint on it), and when every worker
exits with the "preempted" code 75, so does this command, so the batch script can requeue the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

from data_pipeline.executors.cpus import available_cpus
from glm_dist.train.errors import Preempted
from glm_dist.train.preemption import SETTLE_S


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() or 1


def torchrun_argv(args: argparse.Namespace, command: list[str]) -> list[str]:
    nproc = args.nproc_per_node or default_nproc()
    argv = [f"--nproc-per-node={nproc}", f"--max-restarts={args.max_restarts}"]
    if args.nnodes == 1 and not args.rdzv_endpoint:
        argv.append("--standalone")
    else:
        if not args.rdzv_endpoint:
            raise SystemExit("glm launch: --rdzv-endpoint HOST:PORT is required with --nnodes > 1")
        argv += [
            f"--nnodes={args.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={args.rdzv_endpoint}",
            f"--rdzv-id={args.rdzv_id}",
        ]
    return argv + ["-m", "glm_dist.cli", *command]


def check_before_start(command: list[str], *, world_size: int) -> None:
    """A training config that cannot run at this world size fails here, in one line, before any
    worker starts (rather than once per worker after the rendezvous)."""
    if command[:1] != ["train"]:
        return
    ap = argparse.ArgumentParser(prog="glm launch train", add_help=False)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("overrides", nargs="*")
    parsed, _ = ap.parse_known_args(command[1:])
    from glm_dist.config.checks import validate
    from glm_dist.config.loader import load_config

    validate(load_config(parsed.config, parsed.overrides), world_size=world_size)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), e.g. torchrun's workers."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        children[ppid].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


_signalled = False  # a stop signal reached this launcher


def _forward_to_workers(signum, frame) -> None:
    global _signalled
    _signalled = True
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="glm launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nproc-per-node", type=int, default=0, help="default: visible GPUs, else 1")
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--rdzv-endpoint", default="", help="HOST:PORT of the rendezvous (multi-node)")
    ap.add_argument("--rdzv-id", default=os.environ.get("SLURM_JOB_ID", "glm"))
    ap.add_argument("--max-restarts", type=int, default=0)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the glm command to run, e.g. train -c CONFIG")
    args = ap.parse_args(argv)
    if not args.command:
        ap.error("give the glm command to run, e.g. train -c CONFIG")
    nproc = args.nproc_per_node or default_nproc()
    check_before_start(args.command, world_size=nproc * args.nnodes)
    if "OMP_NUM_THREADS" not in os.environ:  # share the CPU cores between local processes
        os.environ["OMP_NUM_THREADS"] = str(max(1, available_cpus() // nproc))

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    # SIGUSR1 and SIGTERM are stop requests (train.stop_signals): passed on to the workers, which finish
    # the step, checkpoint and exit 75 -- what the launcher then returns. torchrun would instead answer a
    # SIGTERM by terminating its workers (SIGKILL 30 s later) and exit 143, which requeues nothing.
    # (torchrun's --signals-to-handle, read from PET_*; older torch reads TORCHELASTIC_SIGNALS_TO_HANDLE)
    for name in ("PET_SIGNALS_TO_HANDLE", "TORCHELASTIC_SIGNALS_TO_HANDLE"):
        os.environ.setdefault(name, "SIGINT,SIGHUP,SIGQUIT")
    # Ctrl-C: torchrun passes SIGINT on, then waits this long before a SIGKILL; a worker gives the save
    # in flight up to SETTLE_S to finish (train/checkpoint.py).
    for name in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        os.environ.setdefault(name, str(int(SETTLE_S) + 30))
    signal.signal(signal.SIGUSR1, _forward_to_workers)
    signal.signal(signal.SIGTERM, _forward_to_workers)
    try:
        run(parse_args(torchrun_argv(args, args.command)))
    except ChildFailedError as err:
        codes = {failure.exitcode for failure in err.failures.values()}
        # Ranks exit 75 only after the collective checkpoint is complete; once the first one has,
        # torchrun may SIGTERM the others on their way out (-15) -- still a preemption.
        if Preempted.exit_code in codes and codes <= {Preempted.exit_code, -signal.SIGTERM}:
            return Preempted.exit_code
        print(f"glm launch: worker(s) failed with exit code(s) {sorted(codes)}", file=sys.stderr)
        return 1
    except SignalException as err:
        # Ctrl-C or a kill: torchrun has passed the signal to the workers and waited for them (a train run
        # stops at its step and saves); the launcher reports it like any stopped command, not as a bug.
        name = signal.Signals(err.sigval).name
        print(
            f"glm launch: stopped by {name}; the workers got it too (their last lines say where they were)",
            file=sys.stderr,
        )
        return 128 + int(err.sigval)
    except RendezvousError as err:
        # After a preemption another node's agent may close the rendezvous store before this one
        # has shut down; the workers have checkpointed and exited by then.
        if _signalled:
            print(f"glm launch: rendezvous closed during the preemption shutdown ({err})", file=sys.stderr)
            return Preempted.exit_code
        raise
    return 0
