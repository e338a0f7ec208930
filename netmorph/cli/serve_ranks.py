"""``netmorph serve`` on several ranks -- tensor parallel (``--tp N``) and disaggregated prefill/decode
(``--disaggregate P:D``, the KV crossing between them), on netmorph's own ranks or a torchrun job's -- and what
every deployment shares: an iteration priced as a real model on real hardware (``--time-model``) and the
``--check`` that decodes requests alone."""

from __future__ import annotations

import copy

from netmorph.cli import print_json
from netmorph.cli.serve_print import print_check, print_disaggregated, print_serve, verdict
from netmorph.runtime.env import torchrun_world


def disaggregated(args, model, cfg, reqs, bad) -> int:
    from netmorph.serving.disagg import serve_disaggregated
    from netmorph.serving.engine import Engine

    P, D = args.disaggregate
    price, priced_model, hardware = priced(args.time_model)
    # prefill and decode on two nodes: a token's KV crosses at the NIC's bandwidth
    kv_s = priced_model.kv_bytes_per_token() / hardware.nic_bandwidth if price else 0.0
    from netmorph.cli.progress import Bar

    with Bar("serve") as bar:
        with bar.task("one colocated engine"):
            together = Engine(model, cfg, price).run(copy.deepcopy(reqs))  # the side-by-side, and the refusals
        rejected = together["rejections"]
        refused = {x["request"] for x in rejected}
        ok = [r for r in reqs if r.rid not in refused]
        with bar.task(f"disaggregated {P}:{D} on {P + D} ranks"):
            out = serve_disaggregated(
                model,
                cfg,
                copy.deepcopy(ok),
                P,
                D,
                timeout=args.timeout,
                price=price,
                kv_seconds_per_token=kv_s,
                backend=backend(),
            )
    if out is None:  # a torchrun rank other than 0: rank 0 prints
        return 0
    out["colocated"] = {k: together[k] for k in ("ttft_s", "tpot_s", "throughput_tok_s", "duration_s")}
    outputs = out.pop("outputs")
    out["rejected"] = len(rejected) + len(bad)
    out["rejections"] = [{"line": k, "reason": why} for k, why in bad] + rejected
    out["scheduler"], out["kv"] = f"disaggregated {P}:{D}", cfg.kv
    if args.check:
        out["check"] = check_alone(args, model, ok, outputs)
    if args.json:
        print_json(out)
        return verdict(out)
    print_disaggregated(args, out, len(ok))
    return print_check(out) if args.check else 0


def tensor_parallel(args, model, cfg, reqs, bad) -> int:
    from netmorph.cli.progress import Bar
    from netmorph.serving.tp import serve_tensor_parallel

    with Bar("serve") as bar, bar.task(f"tensor parallel on {args.tp} ranks"):
        out = serve_tensor_parallel(
            model, cfg, reqs, args.tp, priced(args.time_model)[0], timeout=args.timeout, backend=backend()
        )
    if out is None:  # a torchrun rank other than 0: rank 0 prints
        return 0
    outputs = out.pop("outputs")
    out["rejected"] += len(bad)
    if args.check:
        out["check"] = check_alone(args, model, reqs, outputs)
    if args.json:
        print_json(out)
        return verdict(out)
    print_serve(args, cfg, model, out)
    print(
        f"tensor parallel {args.tp} ranks: {out['tp_allreduces']:,} all-reduces (2 per layer per iteration), "
        f"{out['tp_allreduce_bytes']:,} B sent over all ranks = 2 x layers x 2(t-1) x {out['tokens_computed']:,} "
        f"tokens x hidden x 8 B = {out['tp_allreduce_bytes_formula']:,} B "
        f"({'equal' if out['tp_allreduce_bytes'] == out['tp_allreduce_bytes_formula'] else 'DIFFERENT'}); "
        f"each rank keeps {args.heads // args.tp} of {args.heads} heads' KV"
    )
    return print_check(out) if args.check else 0


def backend() -> str:
    """Under torchrun the job's ranks are the deployment's (WORLD_SIZE = --tp, or P + D); else netmorph's own."""
    return "job" if torchrun_world() is not None else "local"


def check_alone(args, model, reqs, outputs) -> dict:
    """Decode the first ``--check`` completed requests alone (the training model, no cache) and compare."""
    from netmorph.serving.model import generate_alone

    by_id = {r.rid: r for r in reqs}
    ids = sorted(i for i in outputs if i in by_id)[: args.check]
    same = sum(
        outputs[i] == generate_alone(model, by_id[i].prompt, by_id[i].output_len, args.temperature, i * 1_000_003)
        for i in ids
    )
    return {"requests": len(ids), "identical": same}


def priced(text: str):
    """(price of an iteration, the real model, the hardware) for MODEL@HARDWARE; (None, None, None) for
    'measured'."""
    if text == "measured":
        return None, None, None
    from netmorph.mesh.presets import PRESETS as MODELS
    from netmorph.planner.hardware import PRESETS as HARDWARE
    from netmorph.serving.roofline import iteration_time

    name, _, hw = text.partition("@")
    m, h = MODELS[name], HARDWARE[hw]
    return (lambda items: iteration_time(m, h, items)), m, h
