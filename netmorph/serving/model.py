"""The project's GPT served from a paged KV cache (vLLM's PagedAttention, in torch).

The cache is one tensor per layer for keys and one for values, ``(num_blocks,
block_size, heads, head_dim)``. A forward pass takes any mix of sequences, each with
some new tokens (a whole prompt, a prefill chunk, or one decode token) at known
positions: every new token's key and value are written into its slot (block,
offset) from the block manager, then each sequence's queries attend over its keys and
values **gathered through its block table** -- positions 0..p of the sequence, wherever
their blocks lie. The linear layers run on all new tokens of the batch at once (the
iteration-level batch of Orca / vLLM); attention runs per sequence.

:func:`generate_alone` is the reference: the same weights run as the training model
(:class:`netmorph.models.gpt.GPTStage`, causal ``scaled_dot_product_attention`` over
the whole sequence, no cache at all) one token at a time -- what every served request
must equal, token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from netmorph.mesh.placement import parameters
from netmorph.mesh.shape import ModelShape
from netmorph.models.gpt import GPTStage, full_weights


def sample(logits: torch.Tensor, temperature: float, seed: int) -> int:
    """Greedy at temperature 0; else a draw seeded by (request, sample, position) -- the same draw whatever
    batch the token was computed in."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(p, 1, generator=g))


class PagedGPT:
    def __init__(self, cfg: ModelShape, num_blocks: int, block_size: int, dtype=torch.float64, shard=None):
        """``shard = (tp, rank, all_reduce)``: Megatron's tensor-parallel split -- this rank keeps heads
        ``rank·heads/tp ...`` (the QKV rows and the projection's input columns of those heads, its KV cache
        holds only them) and a 1/tp slice of the MLP; ``all_reduce(partial)`` sums the row-parallel outputs
        (Megatron's g) twice per layer, after the attention projection and after the MLP."""
        self.cfg, self.block_size = cfg, block_size
        self.w = full_weights(cfg, dtype)
        self.nh, self.hd = cfg.heads, cfg.hidden // cfg.heads
        self.reduce = None
        if shard is not None and shard[0] > 1:
            tp, rank, self.reduce = shard
            if cfg.heads % tp:
                raise ValueError(f"heads {cfg.heads} not divisible by tp {tp}")
            self.nh = cfg.heads // tp
            for p in parameters(cfg):            # each layer's piece, as training's tensor parallelism holds it
                if p.layer is not None:          # (the word embedding stays whole: every rank computes the logits)
                    self.w[p.name] = p.piece(self.w[p.name], tp, rank).contiguous()
        shape = (num_blocks, block_size, self.nh, self.hd)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.layers)]

    def bytes_per_block(self) -> int:
        return 2 * self.cfg.layers * self.block_size * self.nh * self.hd * self.k[0].element_size()

    def copy_block(self, src: int, dst: int) -> None:
        for layer in range(self.cfg.layers):
            self.k[layer][dst].copy_(self.k[layer][src])
            self.v[layer][dst].copy_(self.v[layer][src])

    def read_blocks(self, blocks) -> list:
        """The contents of ``blocks`` (to the host pool when swapping out)."""
        idx = torch.tensor(blocks, dtype=torch.long)
        return [(self.k[i][idx].clone(), self.v[i][idx].clone()) for i in range(self.cfg.layers)]

    def write_blocks(self, blocks, saved) -> None:
        idx = torch.tensor(blocks, dtype=torch.long)
        for i, (k, v) in enumerate(saved):
            self.k[i][idx] = k
            self.v[i][idx] = v

    def gather(self, layer: int, table, n: int):
        """Keys and values of a sequence's first ``n`` positions, through its block table: (n, heads, hd)."""
        pos = torch.arange(n)
        blocks = torch.as_tensor(table, dtype=torch.long)[pos // self.block_size]
        off = pos % self.block_size
        return self.k[layer][blocks, off], self.v[layer][blocks, off]

    @torch.no_grad()
    def forward(self, items) -> list:
        """``items``: [(tokens, first position, slots [(block, offset)] for those tokens, block table)].
        Returns each item's logits for its last token (V,)."""
        w, cfg = self.w, self.cfg
        toks = torch.tensor([t for it in items for t in it[0]], dtype=torch.long)
        pos = torch.tensor([it[1] + j for it in items for j in range(len(it[0]))], dtype=torch.long)
        slots = [s for it in items for s in it[2]]
        sb = torch.tensor([b for b, _ in slots], dtype=torch.long)
        so = torch.tensor([o for _, o in slots], dtype=torch.long)
        x = w["wte"][toks] + w["wpe"][pos]                                         # (N, h)
        for i in range(cfg.layers):
            a = F.layer_norm(x, (cfg.hidden,), w[f"{i}.ln1.w"], w[f"{i}.ln1.b"], 1e-5)
            qkv = F.linear(a, w[f"{i}.qkv.w"], w[f"{i}.qkv.b"]).view(-1, self.nh, 3, self.hd)
            q, k, v = qkv.unbind(2)                                                # each (N, nh, hd)
            self.k[i][sb, so] = k                                                  # write every new token's KV
            self.v[i][sb, so] = v
            out, start = [], 0
            for tokens, first, _, table in items:
                n = len(tokens)
                kk, vv = self.gather(i, table, first + n)                          # (first+n, nh, hd)
                qq = q[start:start + n].transpose(0, 1)                            # (nh, n, hd)
                mask = torch.arange(first + n)[None, :] <= (first + torch.arange(n))[:, None]   # (n, first+n)
                y = F.scaled_dot_product_attention(qq, kk.transpose(0, 1), vv.transpose(0, 1), attn_mask=mask)
                out.append(y.transpose(0, 1).reshape(n, self.nh * self.hd))        # (n, h/t)
                start += n
            y = torch.cat(out)                                                     # (N, h/t)
            if self.reduce is None:
                x = x + F.linear(y, w[f"{i}.proj.w"], w[f"{i}.proj.b"])           # (N, h)
            else:                                                                  # row-parallel: partial sums
                x = x + self.reduce(F.linear(y, w[f"{i}.proj.w"])) + w[f"{i}.proj.b"]
            m = F.layer_norm(x, (cfg.hidden,), w[f"{i}.ln2.w"], w[f"{i}.ln2.b"], 1e-5)
            g = F.gelu(F.linear(m, w[f"{i}.fc.w"], w[f"{i}.fc.b"]))               # (N, f/t)
            if self.reduce is None:
                x = x + F.linear(g, w[f"{i}.fc2.w"], w[f"{i}.fc2.b"])
            else:
                x = x + self.reduce(F.linear(g, w[f"{i}.fc2.w"])) + w[f"{i}.fc2.b"]
        ends = torch.tensor(list(_ends(items)), dtype=torch.long)
        last = F.layer_norm(x[ends], (cfg.hidden,), w["ln_f.w"], w["ln_f.b"], 1e-5)  # (items, h)
        return list(last @ w["wte"].t())                                          # each (V,)


def _ends(items):
    n = 0
    for it in items:
        n += len(it[0])
        yield n - 1


@torch.no_grad()
def generate_alone(cfg: ModelShape, prompt, n_out: int, temperature: float = 0.0, seed: int = 0) -> list:
    """The reference: the training model over the whole sequence at every step, no cache."""
    model = GPTStage(cfg)
    seq = list(prompt)
    for _ in range(n_out):
        x = torch.tensor(seq, dtype=torch.long).unsqueeze(1)                      # (T, 1)
        h = model.L.embed(model.wte, x, model.wpe)
        for blk in model.blocks:
            h = blk(h)
        logits = model.ln_f(h[-1, 0]) @ model.wte.t()                              # (V,)
        seq.append(sample(logits, temperature, seed + len(seq)))
    return seq[len(prompt):]
