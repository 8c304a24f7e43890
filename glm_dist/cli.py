"""The ``glm`` command (stable names in docs/architecture.md#commands; run ``glm COMMAND --help``).

Each command is a module of ``glm_dist/commands/``, listed in its table; this file parses the command line,
runs the command named and turns what can go wrong into exit codes: 2 and one line for a user's mistake,
1 and one line plus a crash report for a bug, 3 for a run that diverged, ``Preempted.exit_code`` for a
preempted one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from data_pipeline.errors import PipelineError
from glm_common.errors import disk_full
from glm_dist import commands
from glm_dist.checkpoint.files import force_weights_only
from glm_dist.errors import GlmError
from glm_dist.observability.crash_report import write_crash_report
from glm_dist.observability.redact import redact_process_output, redact_text
from glm_dist.parallel.distributed import shutdown_distributed
from glm_dist.train.errors import Preempted, TrainingDiverged

# their message is for the user: one line, exit code 2 (a path given that is missing, or a folder where a file
# belongs, or the reverse: the OSError names it)
USER_ERRORS = (GlmError, PipelineError, FileNotFoundError, IsADirectoryError, NotADirectoryError)


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """``glm``'s parser: every command of the table, or only the command ``only`` (a run builds the parser of
    the command it runs, importing that command's module alone; ``glm --help`` and a typo import them all)."""
    parser = argparse.ArgumentParser(prog="glm", description="Pretrain generalized language models on DeepSpeed.")
    top = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for name in [only] if only else [*commands.COMMANDS, *commands.OWN_OPTIONS]:
        module = commands.load(name)
        *group, leaf = name.split()
        if group and group[0] not in groups:
            group_parser = top.add_parser(group[0], help=commands.GROUPS[group[0]])
            groups[group[0]] = group_parser.add_subparsers(dest=f"{group[0]}_command", required=True)
        sub = (groups[group[0]] if group else top).add_parser(leaf, help=module.HELP)
        if name in commands.COMMANDS:  # the others' options are read by their own parser
            module.add_arguments(sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    """The table's name of the command ``args`` were parsed for (``"data tokenize"``)."""
    group = f"{args.command}_command"
    return f"{args.command} {getattr(args, group)}" if args.command in commands.GROUPS else args.command


def main(argv: list[str] | None = None) -> int:
    """``glm``: a user's mistake or a bad input ends in one line and exit code 2; an unexpected
    error in a one-line summary and the path of its full traceback (exit code 1).

    A rank of a multi-process run ends with ``os._exit`` once its output is flushed: its work is done
    (process group destroyed, checkpoints committed, W&B finished), and the interpreter's teardown can
    still abort it -- C++ threads of gloo or of a library it loaded, destroyed after Python's, end in
    "terminate called without an active exception" (SIGABRT), which turned a finished two-rank run into
    a failed one in CI. Its exit code is then the command's."""
    code = _main(argv)
    world = os.environ.get("WORLD_SIZE", "")
    if "torch.distributed" in sys.modules and world.isdigit() and int(world) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    force_weights_only()  # no torch.load of this process runs pickled code
    logging.basicConfig(level=os.environ.get("GLM_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    redact_process_output()  # no credential in a log line, a warning or fsspec's cache metadata
    argv = sys.argv[1:] if argv is None else argv
    # The deepspeed launcher passes --local_rank=N before our arguments; LOCAL_RANK carries it too.
    for arg in [a for a in argv if a.startswith(("--local_rank=", "--local-rank="))]:
        os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        argv.remove(arg)
    # what error lines name: the command, with its group's subcommand ("data mix")
    command = " ".join(argv[:2] if argv[:1] and argv[0] in commands.GROUPS and len(argv) > 1 else argv[:1]) or "glm"
    try:
        code = _dispatch(argv)
        if "torch.distributed" in sys.modules:  # a command that joined a process group leaves it
            shutdown_distributed()
        return code
    except USER_ERRORS as err:
        print(redact_text(f"glm {command}: error: {err}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glm {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not a user's mistake: a summary here, the traceback in a file
        if disk_full(err):
            print(
                redact_text(
                    f"glm {command}: error: the disk is full ({str(err).splitlines()[0]}); free space or write "
                    f"the output elsewhere and rerun (glm writes its files whole or not at all)"
                ),
                file=sys.stderr,
            )
            return 2
        where = err.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        at = f" at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
        report = write_crash_report(command, err, run_dir=commands.run_dir)
        print(
            redact_text(
                f"glm {command}: internal error: {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}{at}; {report} (please report it)"
            ),
            file=sys.stderr,
        )
        return 1


def _dispatch(argv: list[str]) -> int:
    if argv[:1] and argv[0] in commands.OWN_OPTIONS:  # torchrun's or sbatch's options follow: not parsed here
        return commands.load(argv[0]).main(argv[1:])
    args = _parser(commands.named(argv)).parse_args(argv)
    try:
        return commands.load(_command_name(args)).run(args)
    except TrainingDiverged as err:
        print(f"glm {args.command}: stopped: {err}", file=sys.stderr)
        return 3
    except Preempted as err:
        print(f"glm {args.command}: {err}", file=sys.stderr)
        return Preempted.exit_code


if __name__ == "__main__":
    sys.exit(main())
