"""Cases several test modules share (imported as a module, not through conftest)."""

from netmorph.collectives import ALGORITHMS

# every (op, algorithm) pair the library builds
ALL = [(op, algo) for op, algos in ALGORITHMS.items() for algo in algos]
