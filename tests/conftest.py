"""Suite-wide set-up: registers every fixture module in tests/fixtures and marks integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

_FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = sorted(f"tests.fixtures.{p.stem}" for p in _FIXTURES.glob("*.py") if not p.stem.startswith("_"))

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
