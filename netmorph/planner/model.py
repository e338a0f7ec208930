"""A GPT model as the planner sees it: layers, hidden, heads, sequence, vocabulary, FFN width.

Parameter count and FLOPs per iteration follow Narayanan et al. 2021 ("Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), eq. 2 and 3,
generalised to an FFN width f (the paper has f = 4h):

    P = l (4h² + 2hf + 9h + f) + (V + s) h                    (eq. 2: 12lh²(1 + 13/12h + (V+s)/12lh))
    F = k B s l (8h² + 4hf + 4sh/... )                         (eq. 3, see ``flops_per_iteration``)

A forward pass of one layer costs 2·B·s·(4h² + 2hf) + 4·B·s²·h FLOPs (the four projections, the
two MLP matmuls, and QKᵀ and attention·V), the logit layer 2·B·s·h·V. The backward pass costs
twice the forward; full activation recomputation runs the layers' forward once more: 96 = 4 x 24
in the paper's eq. 3 with recomputation, 72 = 3 x 24 without. Selective recomputation
(Korthikanti et al. 2022) recomputes only the attention core, 4·B·s²·h per layer.

Presets: GPT-3 175B, the ten models of Narayanan et al. 2021 Table 1 (``ptdp-1.7b`` ..
``ptdp-1t``) and the four of Korthikanti et al. 2022 Table 3 (``mt-22b`` .. ``mt-1t``);
all with s = 2048 and V = 51200 as in the papers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from netmorph.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200
    ffn: int = 0                   # 0: 4 x hidden
    params_only: float = 0.0       # a bare parameter count (--params): model-state memory only

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def bare(self) -> bool:
        return self.params_only > 0

    def layer_params(self) -> int:
        h, f = self.hidden, self.f
        return 4 * h * h + 2 * h * f + 9 * h + f

    def embedding_params(self) -> int:
        return (self.vocab + self.seq) * self.hidden

    def params(self) -> float:
        """Eq. 2 of Narayanan et al. 2021 (tied input/output embedding, learned positions)."""
        if self.bare:
            return self.params_only
        return self.layers * self.layer_params() + self.embedding_params()

    def layer_flops_fwd(self, tokens_b: int) -> float:
        """Forward FLOPs of one transformer layer for b sequences (b = ``tokens_b``)."""
        b, s, h, f = tokens_b, self.seq, self.hidden, self.f
        return 2 * b * s * (4 * h * h + 2 * h * f) + 4 * b * s * s * h

    def logit_flops_fwd(self, b: int) -> float:
        return 2 * b * self.seq * self.hidden * self.vocab

    def flops_per_iteration(self, batch: int, recompute: str = "full") -> float:
        """Eq. 3: FLOPs of one iteration of ``batch`` sequences, counting what the GPUs execute.

        recompute = "full": 4 x layer forward (fwd, 2 x bwd, recomputed fwd) + 3 x logits
        (96 B s l h² (1 + s/6h + V/16lh) when f = 4h); "none": 3 x both (72 B s l h²
        (1 + s/6h + V/12lh)); "selective": 3 x both + the attention core again.
        """
        if self.bare:
            raise UsageError("{params} gives model-state memory only; FLOPs need {layers}/{hidden}/{heads} or {model}",
                             "params")
        layer = self.layer_flops_fwd(batch)
        logit = self.logit_flops_fwd(batch)
        if recompute == "full":
            return self.layers * 4 * layer + 3 * logit
        extra = 4 * batch * self.seq * self.seq * self.hidden if recompute == "selective" else 0
        return self.layers * (3 * layer + extra) + 3 * logit

    def model_flops(self, batch: int) -> float:
        """FLOPs of the model itself (no recomputation): what MFU divides by."""
        return self.flops_per_iteration(batch, "none")


def _m(name, layers, hidden, heads, seq=2048, vocab=51200):
    return ModelSpec(name, layers, hidden, heads, seq, vocab)


PRESETS = {m.name: m for m in [
    _m("gpt3-175b", 96, 12288, 96),
    # Narayanan et al. 2021, Table 1 (weak scaling on Selene)
    _m("ptdp-1.7b", 24, 2304, 24), _m("ptdp-3.6b", 30, 3072, 32), _m("ptdp-7.5b", 36, 4096, 32),
    _m("ptdp-18.4b", 40, 6144, 48), _m("ptdp-39.1b", 48, 8192, 64), _m("ptdp-76.1b", 60, 10240, 80),
    _m("ptdp-145.6b", 80, 12288, 96), _m("ptdp-310.1b", 96, 16384, 128), _m("ptdp-529.6b", 105, 20480, 128),
    _m("ptdp-1t", 128, 25600, 160),
    # Korthikanti et al. 2022, Table 3
    _m("mt-22b", 48, 6144, 64), _m("mt-175b", 96, 12288, 96), _m("mt-530b", 105, 20480, 128),
    _m("mt-1t", 128, 25600, 160),
]}


def from_args(model=None, layers=None, hidden=None, heads=None, seq=None, vocab=None, ffn=None,
              params=None) -> ModelSpec:
    """A preset (optionally with fields overridden) or a model from flags; errors name the flag."""
    if params is not None:
        if params <= 0:
            raise UsageError(f"{{params}} must be > 0, got {params}", "params")
        return ModelSpec(f"{params:.3g} params", 0, 0, 0, params_only=float(params))
    if model is not None:
        key = model.lower()
        if key not in PRESETS:
            raise UsageError(f"{{model}}: unknown preset {model!r}; choose one of {', '.join(PRESETS)}", "model")
        spec = PRESETS[key]
        over = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                                      ffn=ffn).items() if v is not None}
        spec = replace(spec, **over) if over else spec
    else:
        missing = ["{" + k + "}" for k, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise UsageError("describe the model with {model} NAME, {params} N, or " + " ".join(missing),
                             missing[0][1:-1])
        spec = ModelSpec("custom", layers, hidden, heads, 2048 if seq is None else seq,
                         51200 if vocab is None else vocab, 0 if ffn is None else ffn)
    for k in ("layers", "hidden", "heads", "seq", "vocab"):
        if not 1 <= getattr(spec, k) <= 1 << 24:
            raise UsageError(f"{{{k}}} must be in 1..{1 << 24:,}, got {getattr(spec, k)}", k)
    if ffn is not None and not 1 <= ffn <= 1 << 26:
        raise UsageError(f"{{ffn}} must be in 1..{1 << 26:,} (omit it for 4 x hidden), got {ffn}", "ffn")
    if spec.hidden % spec.heads:
        raise UsageError(f"{{hidden}} {spec.hidden} is not divisible by {{heads}} {spec.heads}", "hidden")
    return spec
