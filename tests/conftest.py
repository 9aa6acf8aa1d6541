import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def data_dir() -> Path | None:
    """../shared/data through ATTNLAB_DATA (CI sets it); None when absent."""
    d = os.environ.get("ATTNLAB_DATA")
    if d and Path(d).is_dir():
        return Path(d)
    guess = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return guess if guess.is_dir() else None


@pytest.fixture
def shared_data():
    d = data_dir()
    if d is None:
        pytest.skip("shared data not found; set ATTNLAB_DATA")
    return d
