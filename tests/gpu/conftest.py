"""GPU tests: run only where the build has CUDA and a device is visible (the GPU machine)."""
from __future__ import annotations

import pytest

from lucebox import _core


def _has_gpu() -> bool:
    return any(d["type"] == "gpu" for d in _core.devices())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA device visible to this build")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
