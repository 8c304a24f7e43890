"""Build, once, the DeepSpeed op that every process of a CPU run loads at start-up: the shared-memory
collective of DeepSpeed's CPU accelerator (``deepspeed_shm_comm``, JIT-compiled by torch into
``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``). Left to the first training
process, its ~1 minute build falls inside whatever timeout that process runs under, and a build killed
half way leaves a ``lock`` file that makes every later start wait on it for ever. So this removes a
lock no build has touched for ``--stale-after`` seconds, then builds. On CUDA there is nothing to do
(DeepSpeed's CUDA accelerator has no such op); it says so and exits 0.

    python launch/build_ops.py [--stale-after 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stale-after",
        type=float,
        default=600.0,
        help="seconds since a build lock last changed after which it is stale (default 600)",
    )
    args = parser.parse_args(argv)
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        print(f"build_ops: nothing to build on the {get_accelerator().device_name()} accelerator")
        return 0
    lock = os.path.join(_get_build_directory(builder.NAME, verbose=False), "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > args.stale_after:
        os.remove(lock)
        print(f"build_ops: removed {lock}, left by a build that did not finish")
    start = time.perf_counter()
    builder.load(verbose=False)
    print(f"build_ops: {builder.absolute_name()} ready in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
