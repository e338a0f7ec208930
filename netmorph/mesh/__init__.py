"""The system's vocabulary, below everything that trains, plans, serves or moves a model.

- :mod:`.grid`: the named rank grid (``Mesh``, Megatron's ``RankGenerator``) and one rank's process groups
  (``DeviceMesh``, torch's);
- :mod:`.shape`: ``ModelShape``, a transformer's shape (Hugging Face's ``config.json``) and its counts;
- :mod:`.presets`: the published models, and a model from a user's flags, checked;
- :mod:`.layout`: ``Layout``, how a job is split over its ranks, and every rule it must obey (``Rejection``);
- :mod:`.settings`: what a layout carries beside its degrees: ``Batch``, ``Precision``, ``Knobs``;
- :mod:`.placement`: where each parameter of a model lives under a layout (DTensor's placements);
- :mod:`.kernels`: the aten operators netmorph's own GPT dispatches, what a profile's per-operator cost is paid for.
"""

from netmorph.mesh.grid import DIMS, PRINT_ORDER, DeviceMesh, Mesh
from netmorph.mesh.layout import Layout, Rejection
from netmorph.mesh.presets import PRESETS
from netmorph.mesh.settings import Batch, Knobs, Precision
from netmorph.mesh.shape import ModelShape

__all__ = [
    "DIMS",
    "PRINT_ORDER",
    "Batch",
    "DeviceMesh",
    "Knobs",
    "Layout",
    "Mesh",
    "ModelShape",
    "PRESETS",
    "Precision",
    "Rejection",
]
