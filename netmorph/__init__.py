"""netmorph: the distributed system under a large neural network, on one machine.

Every part counts the two hardware-independent quantities NCCL and Megatron-LM
trade against each other -- bytes on the wire and message rounds -- and names
the production primitive it stands in for.

The foundation is :mod:`netmorph.schedule`: a collective algorithm is a
function that returns a :class:`~netmorph.schedule.Schedule`, and that one
object is validated, executed, counted and timed.
"""

from netmorph.collectives import ALGORITHMS, OPS, build
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import Topology, load_topology
from netmorph.errors import UsageError
from netmorph.mesh import Mesh
from netmorph.runtime import Fault, LaunchError, init_from_env, launch
from netmorph.runtime.base import ReduceOp
from netmorph.schedule import Counts, Round, Schedule, count, execute
from netmorph.version import __version__

__all__ = [
    "ALGORITHMS",
    "OPS",
    "Counts",
    "Fault",
    "LaunchError",
    "Mesh",
    "ReduceOp",
    "Round",
    "Schedule",
    "Topology",
    "UsageError",
    "__version__",
    "build",
    "count",
    "execute",
    "init_from_env",
    "launch",
    "load_topology",
    "simulate",
]
