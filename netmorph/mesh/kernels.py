"""What a profile's ``op_overhead_s`` (a kernel launch, eager PyTorch's dispatch and autograd) is paid for: the aten
operators netmorph's own GPT dispatches per layer and per head, forward and backward, whatever the sizes -- traced
by a TorchDispatchMode and held by tests (tests/test_calibrate.py, tests/test_context_parallel.py), read by the
planner's layer costs where a calibrated profile prices netmorph's ranks (the presets charge nothing for them).
"""

from __future__ import annotations

# one dense layer, (forward, backward); the embedding, LM head and loss
LAYER_KERNELS = (30, 66)
HEAD_KERNELS = (14, 23)
# an MoE layer's (Megatron's alltoall dispatcher, netmorph.models.moe): the router, the permutation and the
# combine, then a loop over the rank's local experts -- (forward, backward) fixed, and per local expert
MOE_KERNELS = ((94, 81), (10, 24))
# a layer's attention under context parallelism (netmorph.parallel.context_parallel: chunk pairs of the online
# softmax, the ring's or all-to-all's reshapes) beyond cp 1's, (forward, backward) each a + b·cp operators on the
# busiest rank -- traced at cp 2 and 4; p2p's also holds at cp 8; all_gather's backward differs by up to cp - 1
# operators between ranks, as the gathered blocks' slices its pairs read do
CP_KERNELS = {"p2p": ((27, 59), (67, 134)), "all_gather": ((31, 66), (27, 116)), "a2a": ((27, 3), (28, 0))}


def layer_kernels(model, ep: int = 1) -> tuple:
    """(forward, backward) operators of one of ``model``'s layers, averaged over them: a dense layer's
    :data:`LAYER_KERNELS`; a routed layer's :data:`MOE_KERNELS`, with ``experts / ep`` local experts."""
    if not model.moe_layers:
        return LAYER_KERNELS
    local, share = model.experts / ep, model.moe_layers / model.layers
    moe = [fixed + each * local for fixed, each in zip(*MOE_KERNELS)]
    return tuple(share * m + (1 - share) * d for m, d in zip(moe, LAYER_KERNELS))


def cp_kernels(cp: int, comm_type: str = "p2p") -> tuple:
    """(forward, backward) operators one layer's context-parallel attention adds: :data:`CP_KERNELS`."""
    if cp <= 1:
        return 0, 0
    return tuple(a + b * cp for a, b in CP_KERNELS[comm_type])
