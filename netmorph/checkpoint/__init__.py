"""Checkpoints that outlive the run: torch.distributed.checkpoint's format, written shard by shard from every
rank's state under its layout and read back under any other.

- :mod:`~netmorph.checkpoint.shards`: which boxes of which tensors of the 1-rank model a rank holds (its
  parameters and Adam's moments, from the layout's element map), and which of them it writes;
- :mod:`~netmorph.checkpoint.dcp`: DCP's own planner and writer APIs driven over netmorph's communicator (the
  plans gathered to rank 0, the global plan scattered back, every rank writing its own ``.distcp`` file, rank 0
  the ``.metadata``), and the read of one rank's boxes under a new layout (DCP's resharding);
- :mod:`~netmorph.checkpoint.folder`: ``DIR/step-N`` published atomically (a temporary folder, fsync, rename,
  then ``DIR/latest``), a checksum per file, ``--keep``, and the checks a ``--load`` makes before any rank
  starts.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpointing:
    """A run's checkpoints (Megatron's ``--save``, ``--save-interval``, ``--load``; torchtitan's ``checkpoint``
    section: ``interval``, ``keep_latest_k``, ``async_mode``)."""

    save: str = ""  # the folder checkpoints go to, or "" for none
    every: int = 0  # every N steps, and at the end (0: at the end only)
    keep: int = 0  # keep the newest K (0: all)
    async_save: bool = False  # write in the background, at most one in flight
    load: str = ""  # the checkpoint (a step-N folder) to start from, resolved and verified already
