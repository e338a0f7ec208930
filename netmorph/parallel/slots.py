"""What runs around each forward and backward slot of the trainer's step: ZeRO-3's gather, DDP's arming, the
emulated accelerator's compute (a sleep: eight ranks on two cores still compute in parallel, as eight GPUs
would), and the time the slots took -- the rest of a pipeline rank's step is waiting."""

from __future__ import annotations

import time

import torch


def device_ms(cfg, layers: int, last: bool) -> float:
    """Milliseconds of one microbatch's forward on a rank holding ``layers`` transformer layers (and the LM head
    when ``last``): ``compute_ms``, plus on an emulated accelerator of ``device_flops`` the rank's share of their
    forward FLOPs -- :meth:`ModelShape.layer_flops_fwd <netmorph.mesh.shape.ModelShape.layer_flops_fwd>` per layer
    (the causal half of the scores under flash attention) and the logits, split over tp and cp -- the same FLOPs the
    planner prices a layer at, so a twin of the run knows its compute exactly (the backward sleeps twice this)."""
    if not cfg.device_flops:
        return cfg.compute_ms
    m, b = cfg.model, cfg.layout.batch.micro_batch_size
    flops = layers * m.layer_flops_fwd(b, causal=m.attention == "flash") + (m.logit_flops_fwd(b) if last else 0.0)
    return cfg.compute_ms + 1e3 * flops / (cfg.layout.tp * cfg.layout.cp) / cfg.device_flops


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)


class Hooks:
    """What runs around each forward and backward: ZeRO-3's gather, DDP's arming, emulated compute
    (``compute_ms`` per forward, twice that per backward), and the time spent computing -- the
    rest of a pipeline rank's step is waiting: its bubble."""

    def __init__(self, reps, last_backward: int, compute_ms: float, measure: bool = True, split: bool = False):
        self.reps, self.last, self.ms, self.measure = reps, last_backward, compute_ms, measure
        self.split = split  # a zero-bubble schedule: B sleeps one forward's worth, W the other
        self.zero = reps[0].zero  # ZeRO-3 gathers the dense parameters (experts refuse stage 3)
        self.busy = 0.0
        self.params_storage = {r.flat.data.untyped_storage()._cdata for r in reps}
        self.saved_per_microbatch = 0  # bytes autograd saves for one microbatch's backward (max)

    def forward(self, fn):
        t0 = time.perf_counter()
        _sleep_ms(self.ms)
        if self.zero and self.zero.stage >= 3:
            out = self.zero.forward(fn)  # ZeRO-3's own hooks see the saved tensors (not measured)
        elif not self.measure:
            out = fn()
        else:
            seen = {}

            def pack(x):
                if x.untyped_storage()._cdata not in self.params_storage:
                    seen[(x.data_ptr(), x.numel(), x.dtype)] = x.numel() * x.element_size()
                return x

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                out = fn()
            self.saved_per_microbatch = max(self.saved_per_microbatch, sum(seen.values()))
        self.busy += time.perf_counter() - t0
        return out

    def backward(self, index: int, fn):
        t0 = time.perf_counter()
        _sleep_ms((1 if self.split else 2) * self.ms)
        if index == self.last:
            for r in self.reps:
                r.arm()
        fn()
        for r in self.reps:
            r.after_backward()
        self.busy += time.perf_counter() - t0

    def weight(self, fn):
        """A zero-bubble schedule's W slot: the weight gradients its B queued (emulated: one forward's worth)."""
        t0 = time.perf_counter()
        _sleep_ms(self.ms)
        fn()
        for r in self.reps:
            r.after_backward()  # mixed precision: these gradients into the float32 main ones
        self.busy += time.perf_counter() - t0
