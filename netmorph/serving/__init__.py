"""Serving on the fabric: vLLM's paged KV cache and block manager, iteration-level scheduling, chunked
prefill, preemption, prefix sharing (:mod:`.blocks`, :mod:`.model`, :mod:`.engine`); KV sizes and the
prefill/decode roofline of real models (:mod:`.kv`, :mod:`.roofline`); workloads (:mod:`.workload`)."""
