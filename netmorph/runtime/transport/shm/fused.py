"""The fused multi-peer reduction: every peer's registered buffer reduced into ours in one pass.

When several peers reduce into one and the same segment of ours in one round (a
direct reduce-scatter step, one-shot and two-shot all-reduce), waiting for every
peer's descriptor and then reducing all sources chunk by chunk keeps the
destination in cache: one pass over it instead of one per peer. This is what
vLLM's custom all-reduce (``csrc/custom_all_reduce.cuh``, the 2-stage kernel)
does with all peers' pointers at once. Out of place, the first source is reduced
with the send buffer's block straight into the receive buffer.
"""

from __future__ import annotations

from netmorph.runtime.transport.shm.mapping import address

CHUNK = 256 << 10  # bytes of destination reduced against every source before moving on


class _NotFusable(Exception):
    pass


def fusable(ins) -> bool:
    """Several peers reduce into one and the same single segment."""
    if len(ins) < 2:
        return False
    first = ins[0]
    if len(first.segs) != 1 or first.flags[0] is False:
        return False
    key = (address(first.segs[0]), first.segs[0].nbytes)
    return all(
        len(st.segs) == 1 and st.flags[0] is not False and (address(st.segs[0]), st.segs[0].nbytes) == key for st in ins
    )


def fused_reduce(engine, ins, streams) -> None:
    """Reduce every peer's descriptor into the shared destination, or leave the streams to the
    ordinary engine when a peer sent plain data (then nothing has been consumed)."""
    heads = {}
    channels, f = engine.channels, engine.f

    def ready():
        for st in ins:
            if st not in heads:
                q = engine.inq.get(st.peer)
                h = channels.head_descriptor(st) if q and q[0] is st else None
                if h == ():
                    raise _NotFusable
                if h is not None:
                    heads[st] = h
        return len(heads) == len(ins)

    try:
        engine.wait_for(streams, ready=ready, pull=False)
    except _NotFusable:
        return
    dst = ins[0].segs[0]
    srcs = []
    for st in ins:
        ch, k, nb = heads[st]
        pairs = channels.descriptor_pairs(st, ch, k, nb)
        if len(pairs) != 1 or int(pairs[0, 1]) != dst.nbytes:
            return
        off = int(pairs[0, 0])
        srcs.append(f.arena(st.peer)[off : off + dst.nbytes].view(dst.dtype))
    step = max(1, CHUNK // dst.itemsize)
    ufunc = channels.ufunc
    acc = next((st.flags[0] for st in ins if st.flags[0] is not True), None)  # out of place: the send buffer
    for a in range(0, len(dst), step):
        d = dst[a : a + step]
        first = d if acc is None else acc[a : a + step]
        for src in srcs:
            ufunc(first, src[a : a + step], out=d)
            first = d
    for st in ins:
        ch = heads[st][0]
        st.got, st.done = st.total, True
        engine.inq[st.peer].popleft()
        f.consumed[ch] += 1
        f.ring(st.peer)
