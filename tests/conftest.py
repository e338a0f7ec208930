import numpy as np
import pytest

from netmorph.collectives import ALGORITHMS

ALL = [(op, algo) for op, algos in ALGORITHMS.items() for algo in algos]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
