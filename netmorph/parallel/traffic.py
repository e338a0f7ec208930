"""The bytes each rank should send per training step, by phase: the closed forms beside the ledger.

Ring collectives on n elements of B bytes over g ranks send, per rank, 2(g-1)/g·n·B
(all-reduce) or (g-1)/g·n·B (all-gather, reduce-scatter) when g divides n (Patarasuk
& Yuan 2009; nccl-tests' bus factor). With b = micro-batch size, s = sequence, h =
hidden, V = vocabulary, m = microbatches, Ψ = the elements of this rank's flat
parameter buffer (padded to a multiple of d), and under context parallelism s the s/cp positions a rank holds
and d the dp x cp ranks its gradients reduce over:

- ``dp``   bucketed all-reduce of the gradients: 2(d-1)/d·Ψ·B
- ``zero`` stages 1-2: reduce-scatter + all-gather, the same 2(d-1)/d·Ψ·B;
           stage 3: (2m+1)(d-1)/d·Ψ·B (two gathers per microbatch, one scatter)
- ``tp``   per layer per microbatch 8(t-1)/t·bsh·B (4 all-reduces, or with SP 4
           all-gathers + 4 reduce-scatters of the same bytes; a mixture-of-experts layer 4(t-1)/t·bsh·B, its
           experts being whole on every tp rank); the vocab-parallel
           embedding (first stage) and LM head (last) 2(t-1)/t·bsh·B each; the
           vocab-parallel loss 3 all-reduces of bs elements, 6(t-1)/t·bs·B
- ``cp``   per layer per microbatch, n = bsh/t the rank's queries (K, V alike): ring attention 6(cp-1)·n·B
           (K/V forward, K/V and their gradients back), all_gather 4(cp-1)·n·B, Ulysses' a2a 8(cp-1)/cp·n·B
- ``pp``   per microbatch one activation forward (b·s·h/t' elements, t' = t with SP)
           per chunk that is not the last virtual stage and one gradient back per
           chunk that is not the first
- ``pp.emb`` the tied word embedding's gradient between first and last stage: an
           all-reduce over 2 ranks of V/t·h elements, V·h/t·B
- ``tp.sp-grads`` SP only: the replicated LayerNorm, row biases and positions, all-reduced over TP
- ``edp`` (``zero.edp``) a mixture of experts' expert buffer (Ψ_E elements) reduced over the expert data-parallel
           group of e = dp/ep ranks: 2(e-1)/e·Ψ_E·B, like ``dp``/``zero``
- ``moe.*`` the all-to-alls carry exactly the rows the router sent: for each MoE layer and microbatch, the rows
           to every other ep rank x h x B (``moe.dispatch``, and back as gradients ``moe.combine.bwd``), the rows
           received (``moe.combine`` and ``moe.dispatch.bwd``), and E/ep int64 counts to each other rank
           (``moe.counts``) -- a closed form of the routing, read from the router's decisions, not the ledger
"""

from __future__ import annotations

from netmorph.parallel.algos import CollectiveAlgos, sent


def ring_allreduce(n: int, g: int, isz: int) -> float:
    return 2 * (g - 1) / g * n * isz if g > 1 else 0.0


def ring_half(n: int, g: int, isz: int) -> float:
    return (g - 1) / g * n * isz if g > 1 else 0.0


def predicted(
    cfg,
    lay_pp_rank: int,
    padded: int,
    isz: int,
    first: bool,
    last: bool,
    chunks_layers: int,
    sp_elems: int = 0,
    moe_layers: int = 0,
    tp_rank: int = 0,
) -> dict:
    """{phase: (bytes per rank per step, the formula as text)} for this rank (``tp_rank``: its place in its
    tensor-parallel group, which a non-ring all-reduce's bytes depend on)."""
    m, mb, model = cfg.layout.microbatches, cfg.layout.batch.micro_batch_size, cfg.model
    _, gsz, msz, lsz = cfg.wire_sizes()  # the reduction's, the main gradients', the loss's element bytes
    t, p, v, cp = cfg.layout.tp, cfg.layout.pp, cfg.layout.interleave, cfg.layout.cp
    d = cfg.layout.dp * cp  # the gradients' group: dp x cp
    s = model.seq // cp  # the positions of a sequence this rank holds
    bsh, bs = mb * s * model.hidden, mb * s
    out = {}
    if cp > 1:
        out["cp"] = cp_bytes(cfg.layout.knobs.cp_comm_type, cp, chunks_layers * m, mb * s * model.hidden // t, isz)
    if cfg.layout.zero:
        k = 2 * m if cfg.layout.zero >= 3 else 1  # parameter gathers (16-bit under mixed precision)
        out["zero"] = (
            k * ring_half(padded, d, isz) + ring_half(padded, d, gsz),
            f"{k + 1}(d-1)/d·Ψ·B = {k + 1}·{d - 1}/{d}·{padded}·{isz}"
            if gsz == isz
            else f"(d-1)/d·Ψ·({k}·B_param + B_grad) = {d - 1}/{d}·{padded}·({k}·{isz} + {gsz})",
        )
    elif d > 1:
        if cfg.dp_mode == "bucket":
            out["dp"] = (ring_allreduce(padded, d, gsz), f"2(d-1)/d·Ψ·B = 2·{d - 1}/{d}·{padded}·{gsz}")
    if t > 1 and cfg.algos.tp != CollectiveAlgos.tp:
        out["tp"] = _tp_counted(cfg, bsh, bs, isz, m, chunks_layers, moe_layers, first, last, tp_rank)
    elif t > 1:
        per = 8 * (t - 1) / t * bsh * isz
        dense = chunks_layers - moe_layers  # an MoE layer's experts are whole on every tp rank: only
        total = dense * m * per + moe_layers * m * per / 2  # its attention's 2 all-reduces remain
        text = (
            f"l_rank·m·8(t-1)/t·bsh·B = {chunks_layers}·{m}·8·{t - 1}/{t}·{bsh}·{isz}"
            if not moe_layers
            else f"(l_dense·8 + l_moe·4)·m·(t-1)/t·bsh·B = ({dense}·8 + {moe_layers}·4)·{m}·{t - 1}/{t}·{bsh}·{isz}"
        )
        if first:
            total += m * ring_allreduce(bsh, t, isz)
            text += " + m·2(t-1)/t·bsh·B (embedding)"
        if last:
            total += m * ring_allreduce(bsh, t, isz) + m * 3 * ring_allreduce(bs, t, lsz)
            text += " + m·2(t-1)/t·bsh·B (LM head) + m·6(t-1)/t·bs·B (vocab-parallel loss)" + (
                f", the loss's B {lsz}" if lsz != isz else ""
            )
        out["tp"] = (total, text)
        if cfg.layout.knobs.sequence_parallel and sp_elems:
            out["tp.sp-grads"] = (
                ring_allreduce(sp_elems, t, msz),
                f"2(t-1)/t·{sp_elems}·B (LayerNorms, row biases, positions) = 2·{t - 1}/{t}·{sp_elems}·{msz}",
            )
    if p > 1:
        tprime = t if cfg.layout.knobs.sequence_parallel else 1
        act = bsh // tprime * isz
        if cfg.layout.v_shaped:  # a V: rank 0 sends nothing past the loss, rank p-1's bottom hand-off is local
            fwd = bwd = 1 if lay_pp_rank in (0, p - 1) else 2
        else:
            fwd = v - (1 if lay_pp_rank == p - 1 else 0)  # chunks whose output goes to another stage
            bwd = v - (1 if lay_pp_rank == 0 else 0)
        out["pp"] = (
            (fwd + bwd) * m * act,
            f"({fwd} fwd + {bwd} bwd chunk boundaries)·m·bsh/t'·B = {fwd + bwd}·{m}·{bsh // tprime}·{isz}",
        )
        if (first or last) and not cfg.layout.v_shaped:  # in a V both copies are rank 0's: no wire
            n = model.vocab // t * model.hidden
            out["pp.emb"] = (ring_allreduce(n, 2, msz), f"V/t·h·B = {n}·{msz}")
    return out


def cp_bytes(comm_type: str, cp: int, passes: int, n: int, isz: int) -> tuple:
    """(bytes, formula) of the context-parallel attention of ``passes`` layer-microbatches on one rank, ``n``
    the elements of its queries (b·s/cp·h/t; K and V alike): ring attention passes K/V cp-1 hops forward and
    K/V with their gradients' accumulator cp-1 hops back, 6(cp-1)·n·B; all_gather gathers K/V and
    reduce-scatters their gradients, 4(cp-1)·n·B; Ulysses' four all-to-alls each way send (cp-1)/cp of q, k,
    v and the output, 8(cp-1)/cp·n·B."""
    k, text = {
        "p2p": (6 * (cp - 1), "6(cp-1)"),
        "all_gather": (4 * (cp - 1), "4(cp-1)"),
        "a2a": (8 * (cp - 1) / cp, "8(cp-1)/cp"),
    }[comm_type]
    return (passes * k * n * isz, f"l_rank·m·{text}·bsh/(cp·t)·B = {passes}·{k:g}·{n}·{isz}")


def _tp_counted(cfg, bsh, bs, isz, m, layers, moe_layers, first, last, r) -> tuple:
    """The tensor-parallel all-reduces' bytes under another algorithm than ring (no sequence parallelism: every
    one an all-reduce): per microbatch 4 of bsh elements a dense layer, 2 a mixture-of-experts layer, one for
    the embedding and one for the LM head, 3 of bs for the vocab-parallel loss -- each its schedule's bytes
    from this rank."""
    t, algo = cfg.layout.tp, cfg.algos.tp
    big, small = sent("allreduce", algo, bsh, t, r, isz), sent("allreduce", algo, bs, t, r, isz)
    n_big = m * (4 * (layers - moe_layers) + 2 * moe_layers + int(first) + int(last))
    n_small = m * 3 * int(last)
    return (
        n_big * big + n_small * small,
        f"{n_big} {algo} all-reduces of bsh + {n_small} of bs, each its schedule's bytes from this rank "
        f"= {n_big}·{big} + {n_small}·{small}",
    )


def counted_reductions(cfg, reps, rank: int, isz: int) -> dict:
    """{phase: (bytes, formula)} of each replica's gradient all-reduces where no closed form above holds
    (``--dp-mode naive``: one per parameter; or another algorithm than ring: one per bucket), each its
    schedule's bytes from ``rank``'s place in the replica's group."""
    algo, naive, out = cfg.algos.dp, cfg.dp_mode == "naive", {}
    for rep, name in zip(reps, ("dp", "edp")):
        g = rep.dp.group if rep.dp is not None else None
        if g is None or g.size() < 2 or (not naive and algo == CollectiveAlgos.dp):
            continue
        spans = [p.numel() for p in rep.flat.params] if naive else [hi - lo for lo, hi, _ in rep.dp.buckets]
        r = g.index[rank]
        out[name] = (
            sum(sent("allreduce", algo, n, g.size(), r, isz) for n in spans),
            f"Σ over {'parameters' if naive else 'buckets'} of one {algo} all-reduce each, its schedule's "
            f"bytes from this rank",
        )
    return out


def expert_traffic(
    cfg, padded: int, e: int, isz: int, moe_blocks, ep_rank: int, gsz: int | None = None, cp_rank: int = 0
) -> dict:
    """{phase: (bytes, formula)} of the expert buffer's reduction and of the all-to-alls of ``moe_blocks`` in
    the last step (each block keeps its forwards' :class:`~netmorph.models.moe.LayerStats`); under cp, of the
    router's counts summed over the cp group (member ``cp_rank``) once a layer forward."""
    out = {}
    z = cfg.layout.zero
    if e > 1:
        gsz = isz if gsz is None else gsz
        k = 2 * cfg.layout.microbatches if z >= 3 else (1 if z else 0)  # parameter gathers
        name = "zero.edp" if z else "edp"
        total = k * ring_half(padded, e, isz) + (1 if z else 2) * ring_half(padded, e, gsz)
        out[name] = (
            total,
            f"{k + (1 if z else 2)}(e-1)/e·Ψ_E·B = {k + (1 if z else 2)}·{e - 1}/{e}·{padded}·{gsz}"
            if gsz == isz
            else f"(e-1)/e·Ψ_E·({k}·B_param + {1 if z else 2}·B_grad)",
        )
    h, E = cfg.model.hidden, cfg.model.experts
    away = got = counts = 0
    for b in moe_blocks:
        for st in b.stats:
            ep = len(st.send_rows)
            away += sum(r for j, r in enumerate(st.send_rows) if j != ep_rank)
            got += sum(r for j, r in enumerate(st.recv_rows) if j != ep_rank)
            counts += (ep - 1) * (E // ep) * 8
    if moe_blocks and len(moe_blocks[0].stats[0].send_rows) > 1:
        out["moe.dispatch"] = out["moe.combine.bwd"] = (away * h * isz, f"rows routed away·h·B = {away}·{h}·{isz}")
        out["moe.combine"] = out["moe.dispatch.bwd"] = (got * h * isz, f"rows routed here·h·B = {got}·{h}·{isz}")
        out["moe.counts"] = (counts, f"(ep-1)·E/ep·8 per layer forward = {counts}")
    cp = cfg.layout.cp
    if moe_blocks and cp > 1:  # the microbatch's routing over the cp group, once a layer forward
        stats = [st for b in moe_blocks for st in b.stats]
        counts = [st for st in stats if st.capacity is None]  # dropless: the counts all-reduced
        one = sent("allreduce", cfg.algos.counts, E + 1, cp, cp_rank, 8)
        # with a capacity: every token's k experts and k gates gathered (2k float64 a token; routed = T·k)
        gathered = sum(
            sent("allgather", cfg.algos.allgather, cp * 2 * int(st.routed.sum()), cp, cp_rank, 8)
            for st in stats
            if st.capacity is not None
        )
        text = [f"2(cp-1)/cp·(E+1)·8 per layer forward = {len(counts)}·{one}"] if counts else []
        if gathered:
            text.append(f"(cp-1)·2k·T_rank·8 per layer forward (experts and gates) = {gathered}")
        out["moe.cp"] = (len(counts) * one + gathered, " + ".join(text))
    return out
