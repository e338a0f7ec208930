"""``netmorph morph reshard``: move a training run's live state from one parallel layout to another.

Trains ``--steps`` on the ``--from`` layout, plans the move of every parameter and Adam moment to
the ``--to`` layout (who sends what to whom, counted before anything moves), runs it over the
fabric, checks every element against the state gathered to one place, and trains ``--steps`` more
on the new layout beside an unmorphed run of the same length.
"""

from __future__ import annotations

import json
import sys

from netmorph.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("morph", help="reshard a live training run between layouts (parameters and Adam state)",
                       description="Move the training state from one (tp, pp, dp, ZeRO) layout to another over "
                                   "the fabric: the transfer plan as data, its bytes, the run, the check.")
    p.add_argument("action", choices=("reshard",), help="reshard: one move between two layouts")
    p.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--from", dest="before", default="tp2,pp2", help="layout before, e.g. tp2,pp2 (default)")
    p.add_argument("--to", dest="after", default="dp4,zero3", help="layout after, e.g. dp4,zero3 (default)")
    p.add_argument("--steps", type=int, default=2, help="steps before and after the move (default 2)")
    p.add_argument("--layers", type=int, default=4, help="GPT layers (default 4)")
    p.add_argument("--hidden", type=int, default=32, help="hidden size (default 32)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    p.add_argument("--vocab", type=int, default=64, help="vocabulary (default 64)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step, both layouts (default 8)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits on a silent peer")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _config(model, layout, steps, global_batch, start=0):
    from netmorph.parallel.hybrid import TrainConfig
    if global_batch % layout.dp:
        raise UsageError(f"--global-batch {global_batch} does not split over dp {layout.dp} ({layout.label()})")
    mbs = global_batch // layout.dp
    if mbs < layout.pp:
        raise UsageError(f"--global-batch {global_batch}: {layout.label()} needs at least pp x dp = "
                         f"{layout.pp * layout.dp} sequences per step")
    cfg = TrainConfig(model=model, tp=layout.tp, pp=layout.pp, dp=layout.dp, zero=layout.zero, steps=steps,
                      microbatches=mbs, micro_batch_size=1, start_step=start, overlap=False,
                      schedule="interleaved" if layout.interleave > 1 else "1f1b", interleave=layout.interleave)
    cfg.check()
    return cfg


def run(args) -> int:
    import numpy as np

    from netmorph.models.gpt import GPTConfig
    from netmorph.morph.layouts import parse_layout
    from netmorph.morph.reshard import KINDS, execute, gather_reference, plan
    from netmorph.parallel.hybrid import train_rank
    from netmorph.parallel.state import assemble
    from netmorph.runtime.launch import launch
    if not 1 <= args.world <= 16:
        raise UsageError(f"--world must be in 1..16 (processes on this machine), got {args.world}")
    if not 1 <= args.steps <= 1000:
        raise UsageError(f"--steps must be in 1..1000, got {args.steps}")
    for k in ("layers", "hidden", "heads", "seq", "vocab", "global_batch"):
        if not 1 <= getattr(args, k) <= 4096:
            raise UsageError(f"--{k.replace('_', '-')} must be in 1..4096, got {getattr(args, k)}")
    model = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab)
    layouts = []
    for flag, text in (("--from", args.before), ("--to", args.after)):
        try:
            lay = parse_layout(text, args.world)
            lay.check(model)
        except UsageError as e:
            raise UsageError(f"{flag} {e}") from None
        layouts.append(lay)
    before, after = layouts
    ca = _config(model, before, args.steps, args.global_batch)
    cb = _config(model, after, args.steps, args.global_batch, start=args.steps)
    cw = _config(model, before, 2 * args.steps, args.global_batch)
    p = plan(model, before, after)
    a = launch(train_rank, ca.world, ca, None, None, timeout=args.timeout)
    states = [r["flat_state"] for r in a]
    new, ledger = execute(p, states, timeout=args.timeout)
    ref = gather_reference(p, states)
    exact = all(np.array_equal((st["params"][m.params[0]:m.params[1]] if k == "params" else st[k])[g >= 0],
                               ref[k][g[g >= 0]])
                for m, st in zip(p.maps_after, new) for k in KINDS
                for g in [m.flat[slice(*(m.params if k == "params" else m.optimizer))]])
    b = launch(train_rank, cb.world, cb, None, new, timeout=args.timeout)
    whole = launch(train_rank, cw.world, cw, None, None, timeout=args.timeout)
    losses = next(r["losses"] for r in a if r["losses"]) + next(r["losses"] for r in b if r["losses"])
    unmorphed = next(r["losses"] for r in whole if r["losses"])
    dloss = max(abs(x - y) for x, y in zip(losses, unmorphed))
    fb, fw = assemble(b), assemble(whole)
    dparam = max(float((fb[k] - fw[k]).abs().max()) for k in fw)
    phase = ledger.by_phase().get("morph", {"messages": 0, "bytes": 0})
    seconds = max(st["seconds"] for st in new)
    ok = exact and phase == {"messages": p.messages, "bytes": p.bytes} and dloss <= 1e-9 and dparam <= 1e-9
    matrix = p.bytes_matrix()
    if args.json:
        json.dump({"world": args.world, "before": before.label(), "after": after.label(), **p.summary(),
                   "matrix": matrix.tolist(), "ledger": phase, "reshard_s": seconds, "exact": exact,
                   "losses": losses, "unmorphed_losses": unmorphed, "max_loss_diff": dloss,
                   "max_param_diff": dparam, "ok": ok}, sys.stdout)
        sys.stdout.write("\n")
        return 0 if ok else 1
    print(f"# netmorph morph reshard: GPT {args.layers} layers x {args.hidden} on {args.world} ranks, "
          f"{before.label()} -> {after.label()} after {args.steps} steps (global batch {args.global_batch})")
    print(f"plan      {p.messages} messages in {p.rounds} rounds, {p.bytes:,} B on the wire, "
          f"{p.kept_bytes():,} B kept in place (parameters, Adam m and v; counted before it runs)")
    print("bytes     source rank (rows) -> destination rank (columns):")
    print(f"{'':>10}" + "".join(f"{j:>10}" for j in range(args.world)))
    for i in range(args.world):
        print(f"{i:>10}" + "".join(f"{'-' if v == 0 else f'{v:,}':>10}" for v in matrix[i]))
    same = "=" if phase == {"messages": p.messages, "bytes": p.bytes} else "!="
    print(f"ran       ledger phase morph: {phase['messages']} messages, {phase['bytes']:,} B ({same} the plan) in "
          f"{1e3 * seconds:.1f} ms")
    print(f"check     every parameter and Adam moment equals the state gathered to one place: "
          f"{'yes' if exact else 'NO'}")
    print(f"          {args.steps} more steps on {after.label()} against {2 * args.steps} unmorphed on "
          f"{before.label()}: max |loss diff| {dloss:.1e}, max |param diff| {dparam:.1e} "
          f"{'✓' if ok else '✗ (tolerance 1e-9)'}")
    return 0 if ok else 1
