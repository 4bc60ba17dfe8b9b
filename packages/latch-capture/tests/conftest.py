import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def examples_dir() -> pathlib.Path:
    return ROOT / "examples"


@pytest.fixture(scope="session")
def ops():
    from latch_core.plugins import registries

    return registries().ops
