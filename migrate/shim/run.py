"""Run a Python script as ``__main__`` with the shim installed, like ``python SCRIPT ARGS``."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence


def prepare(*, apex: bool, cuda_on_cpu: bool | None = None) -> bool:
    """Install the requested patches; return whether the CUDA-to-CPU mapping was installed.

    ``cuda_on_cpu=None`` installs the mapping only when CUDA is not available.
    """
    import torch

    if apex:
        from migrate.shim import install

        install()
    if cuda_on_cpu is None:
        cuda_on_cpu = not torch.cuda.is_available()
    if cuda_on_cpu:
        from migrate.shim import cuda_on_cpu as mapping

        mapping.install()
    return cuda_on_cpu


def run_script(script: str, args: Sequence[str] = ()) -> None:
    """Execute ``script`` as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set as Python does."""
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    runpy.run_path(script, run_name="__main__")
