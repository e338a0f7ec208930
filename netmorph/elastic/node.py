"""One node's part of an elastic job on a cluster: join through the lighthouse, train, publish, summarise.

What ``torchrun --nproc-per-node K -m netmorph elastic --lighthouse HOST:P --node-index I --nodes N`` runs in each
worker (:func:`run`). The members train :func:`netmorph.elastic.gpt.gpt_rank` on the cluster's communicator
(:func:`netmorph.elastic.cluster.join`); each publishes its record to the lighthouse when it is done; the final
view's rank 0 waits for every final member's record and returns the job's summary -- the same one ``netmorph
elastic`` prints on one box (:func:`netmorph.elastic.train.summary`) -- so that one process prints for the job,
as nccl-tests under mpirun: node 0's local rank 0 unless the run lost it, a survivor's otherwise.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from netmorph.elastic import gpt
from netmorph.elastic.cluster import join
from netmorph.elastic.membership import Rendezvous
from netmorph.elastic.train import ElasticConfig, summary

RESULT = "netmorph/result/{}"
WEIGHTS = "netmorph/result/{}/w"
STARTED = "netmorph/started"


def _publish(store, slot: int, rec: dict) -> None:
    body = {k: rec[k] for k in ("events", "epochs", "timeline") + (("healed",) if "healed" in rec else ())}
    body["losses"] = {str(k): v for k, v in rec["losses"].items()}
    store.set(WEIGHTS.format(slot), np.asarray(rec["w"], dtype=np.float64).tobytes())
    store.set(RESULT.format(slot), json.dumps(body))


def _read(store, slot: int) -> dict:
    body = json.loads(store.get(RESULT.format(slot)))
    body["losses"] = {int(k): v for k, v in body["losses"].items()}
    body["epochs"] = [tuple(e) for e in body["epochs"]]
    body["timeline"] = [tuple(t) for t in body["timeline"]]
    body["w"] = np.frombuffer(store.get(WEIGHTS.format(slot)), dtype=np.float64)
    return body


def process_start() -> float | None:
    """When this process started, on the wall clock: its age from /proc (the kernel's start time against the
    uptime, both in the same clock) taken from now -- a restarted worker's heal is timed from there, its imports
    and rendezvous included; None off Linux."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _deaths(store, slots) -> list:
    """(slot, when) of every worker that stamped its own kill or stop (the others of its node died with it)."""
    out = []
    for s in slots:
        for key in (f"netmorph/killed/{s}", f"netmorph/hung/{s}"):
            if store.check([key]):
                out.append((s, float(store.get(key))))
                break
    return out


def run(cfg: ElasticConfig, lighthouse: str, node: int, check: bool = False, native: bool = False) -> dict | None:
    """This worker's part of the job (``native``: on the epoch groups' own collectives); the summary on the final
    view's rank 0, None elsewhere."""
    comm = join(lighthouse, node, cfg.nodes, cfg.timeout, native=native, node_group=gpt.cfg_mp(cfg) > 1)
    comm.clock = time.time  # events timed across hosts (the wall clock)
    comm.started_at = process_start()  # a joiner's heal is timed from its process's start
    store, place = comm.store, comm.placement
    store.compare_set(STARTED, "", repr(time.time()))
    t0 = float(store.get(STARTED))
    try:
        rec = gpt.gpt_rank(comm, cfg)
        if rec is not None:
            _publish(store, comm.slot, rec)
            final = Rendezvous(store, cfg.min_workers).current()
            if comm.slot == final.members[0]:  # the final view's rank 0: the job's summary
                deadline = time.monotonic() + cfg.timeout
                while not all(store.check([RESULT.format(m)]) for m in final.members):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"members {list(final.members)} did not all publish their records")
                    time.sleep(0.01)
                results = [_read(store, m) for m in final.members]
                launched = range(max(m for e in results[0]["epochs"] for m in e[1]) + 1)
                out = summary(cfg, results, _deaths(store, launched), t0, time.time() - t0, check)
                out["nodes"], out["nproc_per_node"] = cfg.nodes, place.local_world
                out["backend"] = "torch-native" if native else "torch"
                out["node_group"] = comm.node_transport is not None  # node-mates' calls on torchrun's own group
                healed = [r["healed"] for r in results if "healed" in r]
                if healed:  # a node back: from its workers' asking to their first step
                    out["heal_s"] = max(h["first_step_at"] for h in healed) - min(h["asked_at"] for h in healed)
                out["lighthouse_reconnects"] = store.reconnects
                return out
        return None
    finally:
        comm.close()
