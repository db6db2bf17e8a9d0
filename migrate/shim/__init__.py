"""Runtime emulation of NVIDIA Apex mixed precision on plain PyTorch.

Imports torch; never libcst, click or the codemod's rules. ``cuda_on_cpu`` maps CUDA-only
mixed-precision code to the CPU in float16; ``python -m migrate.shim`` runs a script with it.
"""
