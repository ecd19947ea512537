"""gtrain's JAX wrapper, copied to a node as ``JOB/jaxrun.py``: ``python jaxrun.py SCRIPT ARGS...`` (or
``-m MODULE ARGS...``) calls ``jax.distributed.initialize`` from the ``JAX_*`` variables gtrain's spawner set,
then runs the script as ``__main__`` (``runpy``), with ``sys.argv`` and ``sys.path[0]`` as if it were run
directly. With one process per GPU (``LOCAL_WORLD_SIZE`` > 1) each process takes its own local device."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    import jax

    kw: dict[str, object] = {}
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        kw["local_device_ids"] = [int(os.environ["LOCAL_RANK"])]
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]), **kw)  # type: ignore[arg-type]
    args = sys.argv[1:]
    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
