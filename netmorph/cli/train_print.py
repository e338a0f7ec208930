"""What ``netmorph train`` prints for a run: the header (the model, the layout, the batch), nanoGPT's line per
step with each phase's bytes, the bytes each phase sent beside its closed form, the pipeline's in-flight
microbatches and bubble, model-state memory beside the planner's, the checkpoints, and under ``--check`` and
``--baseline`` the 1-rank run and DDP beside it."""

from __future__ import annotations

from netmorph.mesh.settings import SPLIT_BACKWARD


def _layout(cfg) -> str:
    parts = (
        [f"tp{cfg.layout.tp}"]
        + [f"cp{cfg.layout.cp} {cfg.layout.knobs.cp_comm_type}"] * (cfg.layout.cp > 1)
        + [f"pp{cfg.layout.pp}", f"dp{cfg.layout.dp}"]
    )
    if cfg.layout.ep > 1:
        parts.append(f"ep{cfg.layout.ep}")
    if cfg.layout.zero:
        parts.append(f"ZeRO-{cfg.layout.zero}")
    if cfg.layout.knobs.sequence_parallel:
        parts.append("SP")
    sched = cfg.layout.pipeline_schedule + (f" v={cfg.layout.interleave}" if cfg.layout.interleave > 1 else "")
    return " ".join(parts) + (f", {sched}" if cfg.layout.pp > 1 else "")


def print_run(cfg, out, plan: dict) -> None:
    """The table ``netmorph train`` prints for ``out`` (a :class:`TrainSummary`), model states beside
    ``plan`` (the planner's memory of the same layout)."""
    m = cfg.model
    moe = f", {m.experts} experts top-{m.top_k}" if m.experts else ""
    print(
        f"# netmorph train: GPT l{m.layers} h{m.hidden} heads {m.heads} s{m.seq} V{m.vocab}{moe} "
        f"({m.params():,} params, {'bf16 mixed precision' if cfg.mixed else cfg.dtype}); {_layout(cfg)}; "
        f"{cfg.layout.microbatches} microbatches x "
        f"{cfg.layout.batch.micro_batch_size} per DP rank, global batch {cfg.layout.batch.global_batch}; "
        f"backend {out.backend}"
    )
    from netmorph.parallel.phases import shown_phases

    shown = [ph for ph in shown_phases() if ph in out.bytes_per_rank_by_phase]
    wide = {ph: max(12, len(ph)) for ph in shown}  # a column as wide as its phase's name
    print(
        f"{'step':>4} {'loss':>9} {'time(ms)':>9} {'tokens/s':>9}  "
        + " ".join(f"{ph:>{wide[ph]}}" for ph in shown)
        + "   (bytes sent per rank, max over ranks)"
    )
    tokens = cfg.layout.batch.global_batch * cfg.model.seq
    if out.resumed_from:
        print(
            f"# resumed from {out.resumed_from} (saved after step {cfg.start_step}): the steps from "
            f"{cfg.start_step + 1} on, on the same global batches"
        )
    for k, (loss, t) in enumerate(zip(out.losses, out.step_times_s), cfg.start_step + 1):
        b = out.step_bytes_by_phase[k - 1 - cfg.start_step]
        print(
            f"{k:>4} {loss:>9.5f} {t * 1e3:>9.1f} {tokens / t:>9,.0f}  "
            + " ".join(f"{b.get(ph, 0):>{wide[ph]},}" for ph in shown)
        )
    print(f"# median step {out.step_time_s * 1e3:.1f} ms, {out.tokens_per_s:,.0f} tokens/s")
    parts = out.step_parts
    whole = sum(parts.values()) or 1.0
    print(
        "# the busiest rank's step, mean after the first: "
        + ", ".join(f"{k} {1e3 * v:.1f} ms ({v / whole:.0%})" for k, v in parts.items() if v > 0)
        + " (rest: bubble, pipeline waits and sends, the host's own work; `netmorph validate local` holds each "
        "part against the planner's)"
    )
    if out.backend == "torch-native":
        print(
            "# traffic: torch's own collectives do not say what each rank sent (the ledger holds the buffer "
            "size per call); run --backend local or torch to set it against the closed forms"
        )
        shown = []
    else:
        print("# traffic per rank per step: measured (max over ranks) vs the closed form, exact on every rank:")
    name = max([12] + [len(ph) for ph in shown])
    for ph in shown:
        pred = out.predicted_bytes_per_rank_by_phase.get(ph, 0)
        ok = out.traffic_exact.get(ph, out.bytes_per_rank_by_phase[ph] == pred)  # 0 sent, 0 predicted
        mark = "✓" if ok else "✗"
        print(
            f"#   {ph:<{name}} {out.bytes_per_rank_by_phase[ph]:>12,} {pred:>14,.0f} {mark}  {out.formulas.get(ph, '')}"
        )
    if cfg.layout.pp > 1:
        fl = out.in_flight_peak
        p = cfg.layout.pp
        bound = {
            "afab": f"m = {cfg.layout.microbatches} on stage 0",
            "1f1b": f"p = {p} on stage 0",
            "zb-h1": f"p = {p} on stage 0",
            "zbv": f"2p = {2 * p} chunks of half a stage on every rank, 1F1B's p stages' worth",
            "dualpipev": f"2p+1 = {2 * p + 1} chunks of half a stage on every rank",
        }.get(cfg.layout.pipeline_schedule, "(p-1)·2 + (v-1)·p + 1 on stage 0")
        print(
            f"# pipeline: microbatches in flight per stage {[fl[s] for s in sorted(fl)]} "
            f"({cfg.layout.pipeline_schedule}: at most {bound})"
        )
        if cfg.layout.pipeline_schedule in SPLIT_BACKWARD:
            from netmorph.planner.memory import wgrad_stash_elements

            lay = cfg.layout
            want = (
                max(lay.w_stash(r) for r in range(p))
                * m.layers
                / p
                * sum(wgrad_stash_elements(m, lay))
                * cfg.wire_sizes()[0]
            )
            got = out.memory_bytes["wgrad_stash_peak"]
            print(
                f"# weight-gradient stash (each owed W's linear inputs and output gradients, the most loaded "
                f"rank): {got:,} B vs the memory model's {want:,.0f} {'✓' if got == want else '✗'}"
            )
        bub = out.bubble_fraction
        how = (
            f"emulated compute {cfg.compute_ms:g} ms per forward"
            if cfg.compute_ms
            else "no --compute-ms: with more ranks than cores this measures the scheduler, not the schedule"
        )
        form = bub["form"] + (" (F = B = W)" if cfg.layout.pipeline_schedule in SPLIT_BACKWARD else "")
        print(
            f"# bubble: measured {bub['measured']:.1%} of the pipeline's time idle vs {form} = "
            f"{bub['theory']:.1%} ({how})"
        )
    mem = out.memory_bytes
    parts = []
    for k in ("params", "grads", "optimizer"):
        ok = "✓" if mem[k] == plan[k] else "✗"
        parts.append(f"{k} {mem[k]:,} B vs {plan[k]:,.0f} {ok}")
    print(
        "# model states on the most loaded rank, measured vs the planner's count (the placement table, each "
        "field's most loaded stage): " + ", ".join(parts)
    )
    act = mem.get("activations_peak")
    if act:
        print(
            f"# activations at the peak (saved for backward x microbatches held): {act:,} B; Korthikanti et al.'s "
            f"estimate {plan['activations']:,.0f} B (16-bit; this model has no dropout): "
            f"ratio {act / plan['activations']:.2f}"
        )
    for c in out.checkpoints or []:
        mode = (
            f"staged in the step in {1e3 * c['staged_s']:.0f} ms, written in the background"
            if cfg.checkpoint.async_save
            else "in the step"
        )
        print(
            f"# checkpoint {c['path']}: {c['bytes']:,} B, {1e3 * c['save_s']:.0f} ms ({mode}; "
            f"{c['bytes'] / max(c['save_s'], 1e-9) / 1e6:.0f} MB/s)"
            + (
                f"; removed step {', '.join(map(str, c['removed']))} (--keep {cfg.checkpoint.keep})"
                if c["removed"]
                else ""
            )
        )
    if out.baseline is not None:
        print_baseline(out.baseline)
    if out.reference_losses is not None:
        tol = {"float64": 1e-9, "float32": 1e-4}.get(cfg.dtype, 2e-2)
        ok = "✓" if out.max_rel_loss_diff <= tol else "✗"
        print(
            f"# check: the {'float32 ' if cfg.mixed else ''}1-rank run on the same global batches: max relative "
            f"loss difference "
            f"{out.max_rel_loss_diff:.2e} (<= {tol:g} {ok}), max weight difference "
            f"{out.max_abs_weight_diff:.2e}"
        )


def print_baseline(b: dict) -> None:
    """netmorph, DDP and the no-communication bound, alternated step by step in one launch: each one's median
    step and interquartile range, and a verdict only where the ranges do not overlap."""
    print(
        f"# baseline, same ranks and batches, {b['steps']} steps each after the first, alternated A/B/C in one "
        "launch (median step, interquartile range, tokens/s):"
    )
    for mode, label in (("netmorph", "netmorph"), ("ddp", "PyTorch DDP (gloo)"), ("no_comm", "no communication")):
        q = b[mode]
        print(
            f"#   {label:<20} {1e3 * q['median_s']:8.1f} ms  [{1e3 * q['q1_s']:.1f}, {1e3 * q['q3_s']:.1f}]"
            f"  {q['tokens_per_s']:>9,.0f} tokens/s"
        )
    if b["vs_ddp"] == "too few steps":
        print(
            f"# netmorph {b['of_bound']:.0%} of the no-communication bound, DDP {b['ddp_of_bound']:.0%}: "
            f"{b['steps']} steps counted, too few to call either ratio (--steps 8 or more)"
        )
        return
    to_bound = {
        "faster": "above it, the ranges apart",
        "slower": "below it, the ranges apart",
        "within noise": "the ranges overlap: as fast as the bound at this noise",
    }[b["vs_bound"]]
    to_ddp = {
        "faster": "faster, the ranges apart",
        "slower": "slower, the ranges apart",
        "within noise": "the ranges overlap: not decided",
    }[b["vs_ddp"]]
    print(
        f"# netmorph {b['of_bound']:.0%} of the no-communication bound ({to_bound}), DDP "
        f"{b['ddp_of_bound']:.0%}; netmorph against DDP: {to_ddp}"
    )
