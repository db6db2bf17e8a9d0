"""Shared pytest configuration."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        default=False,
        help="rewrite fixtures/**/*.out.py from the engine's current output (review the diff)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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
