"""Shared pytest configuration.

The codemod tests need no torch. Tests that do skip themselves where it is missing, with the
reason: modules that import it use ``pytest.importorskip("torch", reason=...)``, and tests
that only run it in subprocesses are marked ``torch``. Nothing here imports torch unless a
collected test is marked ``cuda``.
"""

from __future__ import annotations

import importlib.util

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        default=False,
        help="rewrite fixtures/**/*.out.py and *.findings from the engine's current output (review the diff)",
    )


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def _no_cuda_reason() -> str | None:
    """Why ``cuda`` tests cannot run here, or None when a CUDA GPU is available."""
    if not torch_installed():
        return "needs torch with a CUDA GPU; torch is not installed"
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_first(items)
    if not torch_installed():
        skip = pytest.mark.skip(reason="needs torch, which is not installed")
        for item in items:
            if item.get_closest_marker("torch") is not None:
                item.add_marker(skip)
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return
    reason = _no_cuda_reason()
    if reason is not None:
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def _longest_first(items: list[pytest.Item]) -> None:
    """Put the modules with the most slow tests first, keeping the order inside each module.

    xdist (``--dist loadscope --no-loadscope-reorder``) hands whole modules to the workers in
    this order: the long ones then run side by side from the start, instead of one of them
    ending the run alone on one core.
    """
    slow: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    position = {module: index for index, module in enumerate(slow)}
    items.sort(key=lambda item: (-slow[item.nodeid.split("::")[0]], position[item.nodeid.split("::")[0]]))


def pytest_configure(config: pytest.Config) -> None:
    # Session and module fixtures run the CLI too, before any per-test fixture: none of
    # them may write to (or read from) the user's own result cache.
    import os
    import tempfile

    config._ampmigrate_cache = tempfile.mkdtemp(prefix="ampmigrate-test-cache-")  # type: ignore[attr-defined]
    os.environ["AMPMIGRATE_CACHE_DIR"] = config._ampmigrate_cache  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    folder = getattr(config, "_ampmigrate_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_result_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own result cache: none reads another test's entries, or the user's."""
    monkeypatch.setenv("AMPMIGRATE_CACHE_DIR", str(tmp_path_factory.mktemp("result-cache")))
