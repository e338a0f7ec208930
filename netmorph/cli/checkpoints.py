"""The checkpoint flags of every command that trains (``train``, ``moe``): Megatron's ``--save``, ``--save-interval``
(here ``--save-every``), ``--load``, and torchtitan's async save; the checkpoint ``--load`` names found, verified
and held against the run before any rank starts."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from netmorph.cli.flags import int_in
from netmorph.errors import UsageError, require
from netmorph.runtime.env import torchrun_rank


def add_checkpoint_arguments(p) -> None:
    """The checkpoint flags, in a group of their own."""
    c = p.add_argument_group(
        "checkpoints (torch.distributed.checkpoint's format: DIR/step-N/.metadata and one .distcp per rank, DIR/latest)"
    )
    c.add_argument(
        "--save",
        metavar="DIR",
        help="save into DIR at the end, and every --save-every steps "
        "(Megatron's --save; resumable on any layout with --load)",
    )
    c.add_argument(
        "--save-every",
        "--save-interval",
        type=int_in(1, 1 << 24, "1..2**24"),
        default=0,
        metavar="N",
        help="save every N steps too (default: at the end only)",
    )
    c.add_argument(
        "--keep",
        type=int_in(1, 1 << 20, "1..2**20"),
        default=0,
        metavar="K",
        help="keep the newest K checkpoints (default all)",
    )
    c.add_argument(
        "--async-save",
        action="store_true",
        help="write in the background: the step copies its "
        "shards to host memory, a thread writes them, at most one save in flight",
    )
    c.add_argument(
        "--load",
        metavar="DIR",
        help="resume from DIR's latest complete checkpoint (or a step-N "
        "folder), written on any layout: --steps is the total, the run goes on from the step saved; "
        "--load DIR --save DIR with no checkpoint in DIR yet starts at step 0, as a job torchrun restarts needs",
    )


def checkpointing(args, model):
    """The run's :class:`~netmorph.checkpoint.Checkpointing`; ``--load``'s checkpoint found and verified (every
    file against its checksum) and its model the run's, or the one line naming what differs."""
    from netmorph.checkpoint import Checkpointing

    if (args.save_every or args.keep or args.async_save) and not args.save:
        raise UsageError(
            "--save-every, --keep and --async-save shape --save DIR's checkpoints: give --save DIR", "save"
        )
    if args.save:
        root = Path(args.save)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--save {args.save}: cannot make the folder ({e.strerror})", "save") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise UsageError(f"--save {args.save}: the folder is not writable", "save")
    load = ""
    if args.load:
        require("torch", "--load")
        from netmorph.checkpoint import dcp, folder

        if loads_own(args) and not folder.steps(Path(args.save)):
            # the run that saves where it loads (a job torchrun --max-restarts restarts) starts at step 0 until its
            # first checkpoint, as Megatron's --load does on a folder with none
            if torchrun_rank() == 0:
                print(f"# --load {args.load}: no complete checkpoint yet, starting at step 0", file=sys.stderr)
            return Checkpointing(
                save=args.save, every=args.save_every, keep=args.keep, async_save=args.async_save, load=""
            )
        path = folder.resolve(args.load)
        folder.verify(path)
        saved = json.loads(dcp.read_train(path)["meta"])["model"]
        for name, value in asdict(model).items():
            if saved.get(name) != (list(value) if isinstance(value, tuple) else value):
                raise UsageError(
                    f"--load {path}: its model has {name} {saved.get(name)}, this run {value}: pass "
                    f"{{{name}}} {saved.get(name)}",
                    name,
                )
        load = str(path)
    return Checkpointing(
        save=args.save or "", every=args.save_every, keep=args.keep, async_save=args.async_save, load=load
    )


def loads_own(args) -> bool:
    """--load names --save's folder: the one command every attempt of a job torchrun restarts runs."""
    return bool(args.save and args.load) and Path(args.load).resolve() == Path(args.save).resolve()


class AlreadyTrained(Exception):
    """The run that loads where it saves finds its last step saved: a job torchrun restarted after its end."""

    def report(self) -> int:
        """The note, once for the job (rank 0), and the command's exit status: 0, nothing left to do."""
        if torchrun_rank() == 0:
            print(self, file=sys.stderr)
        return 0


def resume_step(path: str, steps: int, batch: int, own: bool = False) -> int:
    """The step a checkpoint was saved after (the data position the run goes on from: its global batches of
    ``batch`` sequences, this run's), below ``--steps``; ``own`` (--load is --save's folder): a checkpoint of
    step --steps means the job is done (:class:`AlreadyTrained`)."""
    from netmorph.checkpoint import dcp

    train = dcp.read_train(Path(path))
    done, saved = int(train["step"]), json.loads(train["meta"])["global_batch"]
    if saved != batch:
        raise UsageError(
            f"--load {path}: its run took {saved} sequences a step, this one {batch}: the data goes on "
            f"from sample {done * saved:,} only with the same global batch (--global-batch-size "
            f"{saved})",
            "global_batch_size",
        )
    if done >= steps and own:
        raise AlreadyTrained(
            f"# --load {path}: saved after step {done}, --steps {steps}: trained already, nothing to do"
        )
    if done >= steps:
        raise UsageError(
            f"--load {path}: it was saved after step {done}, and --steps {steps} is the total: "
            f"raise --steps past {done}",
            "steps",
        )
    return done


def checkpoint_start(args, model, batch: int) -> tuple:
    """(the run's :class:`~netmorph.checkpoint.Checkpointing`, the step it starts after): 0, or the step
    ``--load``'s checkpoint was saved after (``batch``: this run's sequences a step, which must be the saved
    run's)."""
    ck = checkpointing(args, model)
    return ck, resume_step(ck.load, args.steps, batch, loads_own(args)) if ck.load else 0
