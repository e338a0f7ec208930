"""A named rank grid and the process groups cut from it.

Stands in for ``torch.distributed.device_mesh.DeviceMesh`` and Megatron-core's
``RankGenerator`` (``megatron/core/parallel_state.py``): ranks are laid out
with the first name in ``order`` varying fastest -- Megatron's default
``"tp-cp-ep-dp-pp"`` keeps tensor parallelism innermost, so a TP group is a run
of consecutive ranks on one node's NVLink. picotron writes the same grid as
``torch.arange(world).view(dp, pp, cp, tp)``.

Megatron's documented example: 16 ranks, TP=2, PP=4 (so DP=2) give

- TP groups [0, 1], [2, 3], ..., [14, 15]
- DP groups [0, 2], [1, 3], [4, 6], [5, 7], ...
- PP groups [0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]

A mesh is an object passed explicitly; nothing here is module-level state.
(Megatron builds expert-parallel groups with a second generator over the
data-parallel ranks; here ``ep`` is one more grid dimension.)
"""

from __future__ import annotations

import numpy as np

from netmorph.errors import UsageError
from netmorph.runtime.base import Group

DIMS = ("tp", "cp", "ep", "dp", "pp")
PRINT_ORDER = ("tp", "cp", "ep", "pp", "dp")


class Mesh:
    """``Mesh(16, tp=2, pp=4)``; dp defaults to whatever the world leaves."""

    def __init__(
        self,
        world: int,
        tp: int = 1,
        pp: int = 1,
        dp: int | None = None,
        cp: int = 1,
        ep: int = 1,
        order: str = "tp-cp-ep-dp-pp",
    ):
        sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
        if world < 1:
            raise UsageError(f"{{world}} must be >= 1, got {world}", "world")
        for name, v in sizes.items():
            if v < 1:
                raise UsageError(f"{{{name}}} must be >= 1, got {v}", name)
        rest = tp * pp * cp * ep
        if dp is None:
            if world % rest:
                raise UsageError(
                    f"{{world}} {world} is not divisible by tp*cp*ep*pp = {rest}; "
                    f"change {{world}} or {{tp}}/{{pp}}/{{cp}}/{{ep}}",
                    "world",
                )
            dp = world // rest
        if dp < 1 or rest * dp != world:
            raise UsageError(
                f"{{world}} {world} != tp*cp*ep*dp*pp = {tp}*{cp}*{ep}*{dp}*{pp} = {rest * dp}; "
                f"change {{world}} or {{tp}}/{{pp}}/{{dp}}/{{cp}}/{{ep}}",
                "world",
            )
        sizes["dp"] = dp
        names = order.split("-")
        if sorted(names) != sorted(DIMS):
            raise UsageError(
                f"{{order}} must name each of {', '.join(DIMS)} once, joined by '-', got {order!r}", "order"
            )
        self.world, self.order, self.sizes = world, names, sizes
        # first name varies fastest: reshape with the last name as the slowest axis
        self.grid = np.arange(world).reshape([sizes[n] for n in reversed(names)])

    def _axis(self, dim: str) -> int:
        if dim not in self.sizes:
            raise UsageError(f"unknown mesh dimension {dim!r}; choose one of {', '.join(DIMS)}")
        return len(self.order) - 1 - self.order.index(dim)

    def size(self, dim: str) -> int:
        return self.sizes[dim]

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim``: ranks that differ only in their ``dim`` coordinate."""
        ax = self._axis(dim)
        g = np.moveaxis(self.grid, ax, -1).reshape(-1, self.sizes[dim])
        return sorted(g.tolist())

    def groups_over(self, dims) -> list[list[int]]:
        """Every group spanning several dimensions at once: ranks that differ only in ``dims`` (Megatron's
        data-parallel group of a mixture of experts spans ep and the expert data-parallel dp)."""
        axes = [self._axis(d) for d in dims]
        n = int(np.prod([self.sizes[d] for d in dims]))
        g = np.moveaxis(self.grid, axes, list(range(-len(axes), 0))).reshape(-1, n)
        return sorted(sorted(x) for x in g.tolist())

    def group(self, dim: str, rank: int) -> list[int]:
        for g in self.groups(dim):
            if rank in g:
                return g
        raise UsageError(f"rank {rank} is not in 0..{self.world - 1}")

    def coords(self, rank: int) -> dict[str, int]:
        """{dimension: this rank's index along it}."""
        if not 0 <= rank < self.world:
            raise UsageError(f"{{rank}} must be in 0..{self.world - 1}, got {rank}", "rank")
        idx = np.argwhere(self.grid == rank)[0]
        return {n: int(idx[len(self.order) - 1 - i]) for i, n in enumerate(self.order)}

    def shown(self) -> list[str]:
        return [d for d in PRINT_ORDER if d in ("tp", "pp", "dp") or self.sizes[d] > 1]

    def __str__(self) -> str:
        return "-".join(f"{d.upper()}({self.sizes[d]})" for d in self.shown())

    def describe(self, rank: int) -> str:
        """picotron's form: ``TP(2)-PP(4)-DP(2)-Rank(3)``, with this rank's coordinates as ``tp=1 pp=0 dp=1``."""
        return f"{self}-Rank({rank})"


class DeviceMesh:
    """This rank's process groups cut from a :class:`Mesh`: ``mesh["tp"]`` is the group of ranks that
    share every coordinate but tp -- ``torch.distributed.device_mesh.init_device_mesh(...)[dim]
    .get_group()`` in one step.

    ``DeviceMesh(comm, tp=2, pp=2)`` (dp defaults to what the world leaves) is collective: every rank
    creates every group of every dimension of size > 1, in one order, as ``dist.new_group`` requires
    and Megatron's ``initialize_model_parallel`` does; each keeps its own. A dimension of size 1 is
    this rank alone, a group no process group backs (its collectives are the identity).
    """

    def __init__(self, comm, order: str = "tp-cp-ep-dp-pp", **sizes):
        # the members the communicator has now (after an elastic re-form: the survivors, ranks 0..n-1)
        world = comm.WORLD.size() if getattr(comm, "WORLD", None) is not None else comm.world
        self.mesh = Mesh(world, order=order, **sizes)
        self.rank = comm.rank
        self._groups = {}
        for dim in DIMS:
            if self.mesh.size(dim) == 1:
                self._groups[dim] = Group([self.rank])
                continue
            for ranks in self.mesh.groups(dim):
                g = comm.new_group(ranks)
                if self.rank in ranks:
                    self._groups[dim] = g

    def __getitem__(self, dim: str):
        if dim not in self._groups:
            raise UsageError(f"unknown mesh dimension {dim!r}; choose one of {', '.join(DIMS)}")
        return self._groups[dim]

    def get_group(self, mesh_dim: str):
        """torch's spelling of ``mesh[mesh_dim]``."""
        return self[mesh_dim]

    def size(self, dim: str) -> int:
        return self.mesh.size(dim)

    def get_local_rank(self, mesh_dim: str) -> int:
        """This rank's coordinate along ``mesh_dim`` (its index in ``mesh[mesh_dim]``)."""
        return self.mesh.coords(self.rank)[mesh_dim]

    def __repr__(self) -> str:
        return f"DeviceMesh({self.mesh}, rank {self.rank})"
