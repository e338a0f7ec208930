"""What a run will ask of this machine, estimated before any rank starts: memory and time.

Stands in for the sizing step a cluster scheduler and the training stacks do before a job
starts (DeepSpeed's ``estimate_zero3_model_states_mem_needs``, Slurm's ``--mem`` and
``--time``): a size flag off by three digits (``--hidden 65536``, ``--steps 999999``) is
refused with one line naming the flags to change, instead of exhausting memory in eight
forked ranks or running for days. The estimates are deliberately generous -- a run near
the limits is let through -- and the limits are this machine's: its physical memory and
:data:`MAX_SECONDS` of compute at :data:`FLOPS_PER_CORE`.
"""

from __future__ import annotations

import os

from netmorph.errors import UsageError

FLOPS_PER_CORE = 50e9  # float32 FLOP/s a rank's matmuls reach on one core here (measured 20-50 G)
RANK_OVERHEAD_BYTES = 300 << 20  # a forked rank with torch imported: ~250 MB resident, measured
STEP_OVERHEAD_S = 2e-3  # per microbatch and stage: Python, autograd and the fabric's calls
MAX_SECONDS = 3600.0  # a laptop run, not a cluster job
# seconds a step or an update takes here, about half of what 2 cores measured (a generous estimate lets a run near
# the limit through): netmorph elastic's GPT job 15 ms a step on 2 workers and its least squares 0.3 ms; an SGD
# update of the MLP 0.9 ms, of the linear models 0.1 ms with 2 workers and 0.28 ms with 4 (netmorph sgd
# --compute-ms 0: the workers' updates contend for the cores, so they are not divided among them)
ELASTIC_STEP_S = {"gpt": 8e-3, "lsq": 1.5e-4}
SGD_UPDATE_S = {"mlp": 4e-4}
SGD_UPDATE_DEFAULT_S = 1e-4
MEMORY_SHARE = 0.8  # of physical memory


def cores() -> int:
    return os.cpu_count() or 1


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _fmt_s(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def check(memory_bytes: float, seconds: float, what: str, memory_flags: str, time_flags: str) -> None:
    """UsageError naming the flags to lower when the estimate is past this machine's memory or
    :data:`MAX_SECONDS`."""
    limit = MEMORY_SHARE * physical_memory()
    if memory_bytes > limit:
        raise UsageError(
            f"{what} needs about {memory_bytes / 2**30:,.1f} GiB, more than {limit / 2**30:.1f} GiB "
            f"({MEMORY_SHARE:.0%} of this machine's memory); lower {memory_flags}"
        )
    if seconds > MAX_SECONDS:
        raise UsageError(
            f"{what} would take about {_fmt_s(seconds)} on this machine ({cores()} cores), more than "
            f"{_fmt_s(MAX_SECONDS)}; lower {time_flags}"
        )


def ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def training(
    *,
    params_per_rank: float,
    active_params: float,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int,
    micro_batch: int,
    microbatches: int,
    steps: int,
    world: int,
    tp: int = 1,
    pp: int = 1,
    itemsize: int = 4,
    in_flight: int | None = None,
    extra_bytes_per_rank: float = 0.0,
    data_bytes: float = 0.0,
) -> tuple[float, float]:
    """(bytes, seconds) of a model trained on ``world`` local ranks, each holding ``params_per_rank`` with
    Adam (weights, grads, m, v), the activations of the microbatches it holds, its data (``data_bytes``: what
    the data loader holds, :func:`netmorph.models.gpt.synthetic_data_bytes`) and itself; FLOPs
    6·active_params·tokens plus attention's, shared by the cores."""
    states = 4 * params_per_rank * itemsize
    held = in_flight if in_flight is not None else (min(microbatches, pp) if pp > 1 else 1)
    per_mb = micro_batch * seq * (layers * (34 * hidden + 5 * heads * seq) / pp + 4 * vocab) * itemsize / tp
    memory = world * (states + held * per_mb + data_bytes + RANK_OVERHEAD_BYTES + extra_bytes_per_rank)
    dp = max(1, world // (tp * pp))
    tokens = micro_batch * seq * microbatches * dp
    flops = 6 * active_params * tokens + 12 * layers * hidden * seq * tokens
    seconds = steps * (flops / (FLOPS_PER_CORE * min(world, cores())) + STEP_OVERHEAD_S * microbatches * pp)
    return memory, seconds


def serving(
    *,
    params: float,
    layers: int,
    hidden: int,
    kv_slots: int,
    ranks: int,
    prompt_tokens: float,
    output_tokens: float,
    max_seqs: int,
) -> tuple[float, float]:
    """(bytes, seconds) of serving a workload: float64 weights and the K/V cache of ``kv_slots`` token
    slots on each rank; each generated token 2·params FLOPs, prompts once, and one iteration per output
    token of the busiest batch (Python and the scheduler's per-iteration cost)."""
    memory = ranks * (8 * params + 2 * 8 * layers * hidden * kv_slots + RANK_OVERHEAD_BYTES)
    iterations = output_tokens / max(1, max_seqs) + 1
    seconds = 2 * params * (prompt_tokens + output_tokens) / FLOPS_PER_CORE + iterations * STEP_OVERHEAD_S * layers
    return memory, seconds


def elastic(job: str, workers: int, steps: int, runs: int = 1) -> float:
    """Seconds of ``runs`` elastic runs (``--compare``: three) of ``steps`` steps on ``workers`` ranks."""
    return runs * steps * ELASTIC_STEP_S.get(job, ELASTIC_STEP_S["gpt"]) * max(1.0, workers / cores())


def sgd(model: str, workers: int, steps: int, compute_ms: float, modes: int = 1) -> float:
    """Seconds of ``modes`` SGD runs, each ``steps`` updates per worker: the emulated compute of every step (the
    workers compute at once) and every update's own cost."""
    update = SGD_UPDATE_S.get(model, SGD_UPDATE_DEFAULT_S)
    return modes * steps * (compute_ms / 1e3 + workers * update)
