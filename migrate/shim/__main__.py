"""``python -m migrate.shim [--native] [--no-cuda-on-cpu] SCRIPT [ARGS...]``

Runs SCRIPT as ``__main__`` exactly like ``python SCRIPT ARGS...`` (``sys.argv`` is
``[SCRIPT, *ARGS]``, ``sys.path[0]`` is SCRIPT's folder, its exit status is ours), after:

- without ``--native``: installing the Apex shim (``migrate.shim.install()``), so ``import apex``
  and ``from apex import amp`` resolve to it;
- in both modes, when CUDA is not available: ``migrate.shim.cuda_on_cpu.install()``, so CUDA
  autocast, GradScaler and ``.cuda()`` run on the CPU in float16. ``--no-cuda-on-cpu`` skips it.

``--native`` is for migrated scripts that no longer import apex. Options must come before
SCRIPT; everything after SCRIPT is passed to it untouched.
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m migrate.shim [--native] [--no-cuda-on-cpu] SCRIPT [ARGS...]"


def main(argv: list[str]) -> int:
    """Parse our options up to SCRIPT, then run SCRIPT with the rest."""
    apex = True
    cuda_on_cpu: bool | None = None
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        option = argv[index]
        if option == "--native":
            apex = False
        elif option == "--no-cuda-on-cpu":
            cuda_on_cpu = False
        elif option in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            print(f"{USAGE}\nunknown option: {option}", file=sys.stderr)
            return 2
        index += 1
    if index >= len(argv):
        print(USAGE, file=sys.stderr)
        return 2

    from migrate.shim.run import prepare, run_script

    prepare(apex=apex, cuda_on_cpu=cuda_on_cpu)
    run_script(argv[index], argv[index + 1 :])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
