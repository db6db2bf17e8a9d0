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


@pytest.fixture(autouse=True)
def _private_result_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own result cache: none reads another test's entries, or the user's."""
    monkeypatch.setenv("AMPMIGRATE_CACHE_DIR", str(tmp_path_factory.mktemp("result-cache")))
