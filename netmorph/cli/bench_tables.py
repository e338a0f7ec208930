"""``netmorph bench``'s output, as nccl-tests prints it: one table per algorithm (out-of-place and in-place
groups, its footers), torch.distributed's own collective after them, the cost model's prediction and the share
of a memory copy beside every row, then per size the best algorithm measured beside the model and gloo; or the
same rows as CSV (``--csv``) or JSON (``--json``)."""

from __future__ import annotations

import contextlib
import csv
import sys

from netmorph.cli import print_json
from netmorph.collectives import ALGORITHMS, ROOTED
from netmorph.units import parse_nccl_size

CSV_FIELDS = (
    "op",
    "algo",
    "backend",
    "world",
    "bytes",
    "count",
    "type",
    "redop",
    "root",
    "time_s",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "in_place_time_s",
    "in_place_algbw_gbps",
    "in_place_busbw_gbps",
    "in_place_wrong",
    "predicted_time_s",
    "of_memcpy",
)


def tables(args, op, sizes, algos, compare, no_torch, topo, copy_bw, measure_algo, quiet, gloo_lacks) -> int:
    """One nccl-tests table per algorithm (and gloo's), as each completes; then per size the best
    algorithm beside the cost model and gloo. ``gloo_lacks``: the types asked for that gloo's runs leave out."""
    from netmorph.cli.progress import Bar
    from netmorph.report.table import PROGRAMS, nccl_footer, nccl_header, nccl_row, wrong_elements

    text = not (args.json or args.csv)
    step = f"{args.stepfactor}(factor)" if args.stepfactor > 1 else f"{parse_nccl_size(args.stepbytes)}(bytes)"
    if text:
        print(
            f"# netmorph bench {op}: {args.world} rank{'s' if args.world > 1 else ''}, backend {args.backend}; "
            f"time: the slowest rank's mean"
        )
        top = sizes[-1] if args.sizes is not None else parse_nccl_size(args.maxbytes)
        print(
            f"# nThread {args.nthreads} nGpus {args.ngpus} minBytes {sizes[0]} maxBytes {top} step: {step} "
            f"warmup iters: {args.warmup} iters: {args.iters} agg iters: 1 validation: {args.check} graph: 0"
        )
        if no_torch:
            print(f"# {no_torch}; add --no-compare to skip it")
    writer = None
    if args.csv:
        writer = csv.DictWriter(sys.stdout, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
    runs = [(a, args.backend) for a in algos] + ([("native", "torch-native")] if compare else [])
    rows = []
    with Bar("bench") if not quiet else contextlib.nullcontext() as bar:
        for algo, backend in runs:
            with bar.task(f"{algo} ({backend})") if bar else contextlib.nullcontext():
                here = [_finish(r, op, topo, copy_bw, args.world) for r in measure_algo(algo, backend)]
            if text:
                label = (
                    "torch.distributed's own collective (gloo)"
                    if algo == "native"
                    else f"algorithm {here[0]['algo'] if here else algo}, backend {backend}"
                )
                if backend != "local" and gloo_lacks:
                    label += f" (gloo has no {', '.join(gloo_lacks)}: left out)"
                print(f"#\n# {label}")
                print("\n".join(nccl_header()))
                for r in here:
                    print(nccl_row(r))
                print("\n".join(nccl_footer(here, PROGRAMS[op])), flush=True)
            elif writer is not None:
                writer.writerows(here)
                sys.stdout.flush()
            rows += here
    if args.json:
        print_json(rows, indent=1)
    if text:
        _summary(rows, sizes, args.backend, topo)
    return 1 if wrong_elements(rows) else 0


def _finish(r, op, topo, copy_bw, world):
    """The prediction and the share of a memory copy beside one measured row."""
    from netmorph.cost.topology import PRESETS
    from netmorph.cost.tuner import auto_algo, predict
    from netmorph.units import numpy_dtype

    itemsize = numpy_dtype(r["type"]).itemsize
    if r["algo"] == "auto":
        r["algo"] = auto_algo(op, world, r["bytes"], itemsize, PRESETS["local-shm"]) + " (auto)"
    base = r["algo"].split(" ")[0]
    r["predicted_time_s"] = (
        predict(op, base, world, r["bytes"], topo, itemsize, **({"root": r["root"]} if op in ROOTED else {})).time
        if base in ALGORITHMS[op]
        else None
    )
    r["of_memcpy"] = r["busbw_gbps"] / copy_bw if copy_bw else None
    return r


def _summary(rows, sizes, backend, topo) -> None:
    """Per size (of the first type and op): the fastest algorithm measured, its prediction, and gloo."""
    first = rows[0] if rows else None
    if first is None:
        return
    print(f"#\n# netmorph: the best algorithm per size (out of place), the cost model on {topo.name}, and gloo")
    for n in dict.fromkeys(r["bytes"] for r in rows):
        here = [
            r
            for r in rows
            if r["bytes"] == n
            and r["type"] == first["type"]
            and r["redop"] == first["redop"]
            and r["root"] == first["root"]
        ]
        mine = [r for r in here if r["backend"] == backend]
        gloo = [r for r in here if r["backend"] == "torch-native"]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["time_s"])
        pred = f", predicted {best['predicted_time_s'] * 1e6:.1f} us" if best["predicted_time_s"] is not None else ""
        vs = ""
        if gloo and backend != "torch-native" and gloo[0]["time_s"] > 0:
            vs = f"; gloo {gloo[0]['time_s'] * 1e6:.1f} us ({gloo[0]['time_s'] / best['time_s']:.1f}x the time)"
        print(
            f"# {n:>12} B: {best['algo']} {best['time_s'] * 1e6:.1f} us, busbw {best['busbw_gbps']:.2f} GB/s "
            f"({best['of_memcpy']:.0%} of a memcpy){pred}{vs}"
        )
