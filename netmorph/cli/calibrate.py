"""``netmorph calibrate``: measure this machine's ranks -- compute with every rank busy, each link's α and β --
and write the profile ``netmorph plan --hardware`` and ``netmorph simulate step --hardware`` read. Under
torchrun it measures the job's ranks instead (their GPUs and NCCL where there are GPUs); rank 0 writes."""

from __future__ import annotations

from netmorph.cli import print_json
from netmorph.cli.flags import add_timeout, link_mbps, output_file
from netmorph.errors import UsageError, require
from netmorph.files import write_json
from netmorph.units import fmt_bytes

FLAGS = {"inter_mbps": "--inter-node-mbps"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure this machine's compute and links into a profile for plan/simulate",
        description="Time the GEMM shapes of a transformer layer, an elementwise pass and one "
        "operator on every rank at once, fit each link class's alpha and beta from a "
        "ping-pong sweep, and write the planner's hardware fields with the raw "
        "measurements and the fit residuals. Under torchrun it measures the job's "
        "ranks (their GPUs and NCCL where there are; rank 0 writes): "
        "torchrun --nproc_per_node=8 -m netmorph calibrate --dtype bfloat16 "
        "--preset h100-80g",
    )
    p.add_argument("--world", type=int, help="ranks to measure at once (2..64, default 4; under torchrun the job's)")
    p.add_argument(
        "--backend",
        choices=("local", "torch"),
        help="local shared-memory fabric (default) or torch.distributed (gloo; NCCL between GPUs; "
        "the only one under torchrun)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64", "bfloat16"),
        help="what the GEMMs and passes compute in (default float32, netmorph train's; bfloat16 on GPUs)",
    )
    p.add_argument(
        "--preset",
        help="under torchrun on GPUs: the hardware preset (h100-80g, h200, ...) whose "
        "datasheet peaks the GEMM-shape and attention efficiency are measured "
        "against, written into the profile as the presets carry them",
    )
    p.add_argument(
        "--inter-node-mbps",
        type=link_mbps,
        help="emulate two nodes of world/2 ranks joined by a link of this many MB/s (local backend)",
    )
    p.add_argument(
        "--out", type=output_file(("json",)), default="profile.json", help="the profile to write (default profile.json)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="two hidden sizes and short measurement windows: a rougher profile in a few seconds",
    )
    p.add_argument("--json", action="store_true", help="print the profile instead of the summary")
    add_timeout(p, 60.0)
    p.set_defaults(run=run, flags=FLAGS)


def run(args) -> int:
    require("torch", "calibrate")
    from netmorph.runtime.env import torchrun_world

    quick = {"hidden": (32, 64), "window": 0.005} if args.quick else {}
    job = torchrun_world()
    if job is not None:
        return _in_job(args, job, quick)
    if args.preset:
        raise UsageError("--preset measures GPUs against a datasheet: run calibrate under torchrun on them")
    from netmorph.calibrate.run import PHASES, calibrate
    from netmorph.cli.progress import Bar

    world = 4 if args.world is None else args.world
    with Bar("calibrate") as bar, bar.task(f"measuring {world} ranks", len(PHASES)) as task:
        prof = calibrate(
            world,
            args.backend or "local",
            args.dtype,
            args.inter_node_mbps,
            timeout=args.timeout,
            on_phase=lambda name: bar.update(task, advance=1),
            **quick,
        )
    return _write(args, prof)


def _in_job(args, job: int, quick: dict) -> int:
    """One process of a torchrun job: measure the job's ranks; rank 0 writes and prints the profile."""
    from netmorph.calibrate.run import calibrate_in_job
    from netmorph.planner.hardware import PRESETS
    from netmorph.runtime import init_from_env

    if args.backend == "local":
        raise UsageError("--backend local forks its own ranks; under torchrun calibrate measures the job's (torch)")
    if args.world is not None and args.world != job:
        raise UsageError(f"--world {args.world} != torchrun's WORLD_SIZE {job}; drop --world under torchrun")
    if args.inter_node_mbps is not None:
        raise UsageError("--inter-node-mbps emulates nodes on the local fabric; torchrun's nodes are real")
    if args.preset is not None and args.preset not in PRESETS:
        raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
    comm = init_from_env("torch", args.timeout)
    try:
        prof = calibrate_in_job(comm, args.dtype, **quick, preset=PRESETS.get(args.preset))
    finally:
        comm.close()
    if prof is None:  # not rank 0: rank 0 writes for the job, as nccl-tests under mpirun
        return 0
    return _write(args, prof)


def _write(args, prof: dict) -> int:
    write_json(args.out, prof, indent=1)
    if args.json:
        print_json(prof, indent=1)
        return 0
    print_profile(prof, args.out)
    return 0


def print_profile(prof: dict, path: str) -> None:
    m, c, hw = prof["machine"], prof["compute"], prof["hardware"]
    alone, busy = c["alone"], c["busy"]
    best = max(r for *_, r in alone["gemm"])
    where = f"{m['cores']} cores" if m.get("device", "cpu") == "cpu" else "their GPUs"
    print(
        f"# netmorph calibrate: {m['ranks']} {m['backend']} ranks on {where}, {m['dtype']}, "
        f"{m['threads_per_rank']} thread per rank"
    )
    print(f"{'# compute, per rank':<28} {'alone':>14} {'all ranks busy':>16} {'slowdown':>9}")
    print(
        f"{'#   GEMM (best shape)':<28} {best / 1e9:>9.2f} GF/s {hw['peak_flops'] / 1e9:>11.2f} GF/s "
        f"{c['sharing_slowdown']:>8.2f}x"
    )
    print(
        f"{'#   elementwise pass':<28} {alone['elementwise_bytes_per_s'] / 1e9:>9.2f} GB/s "
        f"{busy['elementwise_bytes_per_s'] / 1e9:>11.2f} GB/s {c['elementwise_slowdown']:>8.2f}x"
    )
    print(
        f"{'#   one operator (autograd)':<28} {alone['op_s'] * 1e6:>11.1f} us {busy['op_s'] * 1e6:>13.1f} us "
        f"{busy['op_s'] / alone['op_s']:>8.2f}x"
    )
    print(
        f"{'#   Adam step (the trainer)':<28} {alone['optimizer_bytes_per_s'] / 1e9:>9.2f} GB/s "
        f"{busy['optimizer_bytes_per_s'] / 1e9:>11.2f} GB/s "
        f"{alone['optimizer_bytes_per_s'] / busy['optimizer_bytes_per_s']:>8.2f}x"
    )
    for shape, a, b in zip(c["references"], alone["reference_s"], busy["reference_s"]):
        name = f"#   GPT h {shape['hidden']} s {shape['seq']} fwd+bwd"
        print(f"{name:<28} {a * 1e3:>11.2f} ms {b * 1e3:>13.2f} ms {b / a:>8.2f}x")
    print(
        f"# the reference GPTs, every rank at once, calls back to back, against what the rates above "
        f"predict for them: operators x{c['operator_scale']:.2f}, FLOPs and bytes x{hw['compute_scale']:.2f}; a "
        f"rank computes {hw['core_sharing']:.2f}x slower with every rank busy than alone"
    )
    ov = busy["overlap"]
    if "bytes" not in ov:
        print(f"# overlap: {prof['assumed']['overlap']}")
    else:
        print(
            f"# overlap: a {fmt_bytes(ov['bytes'])} ring all-reduce on a thread beside GEMMs: "
            f"{ov['comm_s'] * 1e3:.1f} + {ov['compute_s'] * 1e3:.1f} ms apart, {ov['both_s'] * 1e3:.1f} ms together "
            f"on rank 0; hidden on the worst rank {ov['overlap']:.0%}"
        )
    table = ", ".join(f"<= {b * 1e3:.3g} MFLOP {100 * e:.0f}%" for b, e in hw["gemm_table"])
    print(f"# GEMM efficiency by size (of {hw['peak_flops'] / 1e9:.2f} GF/s, all busy): {table}")
    if not prof["links"]:
        print(f"# links: {prof['assumed']['links']}")
    else:
        print(f"{'# links, one way':<28} {'alpha':>10} {'1/beta':>12} {'fit residuals':>22}")
    for name, link in prof["links"].items():
        res = link["residuals"]
        base = f", and {link['base'] * 1e6:.1f} us per call" if link.get("base") else ""
        print(
            f"#   {name + ' (0 <-> ' + str(link['peer']) + ')':<24} {link['alpha'] * 1e6:>7.1f} us "
            f"{fmt_bytes(1 / link['beta']):>10}/s   {min(res):+7.1%} .. {max(res):+.1%}   "
            f"({link['fitted_from']}{base})"
        )
    relays = busy.get("relay") or []
    if relays:
        chains = ", ".join(str(r["p"]) for r in relays)
        steps = " / ".join(f"{1e3 * r['step_s']:.1f}" for r in relays)
        alone_ = " / ".join(f"{1e3 * r['compute_s']:.1f}" for r in relays)
        print(
            f"# pipeline hop: GEMMs relayed along chains of {chains} ranks as a GPipe step (every chain at once): "
            f"{steps} ms a step, {alone_} ms without the messages: a send costs "
            f"{1e3 * hw['pipeline_hop_s']:.2f} ms beyond the link's alpha and beta (its receiver waited asleep)"
        )
    preset = prof.get("preset_fields")
    if preset:
        table = ", ".join(f"<= {b:g} GFLOP {100 * e:.0f}%" for b, e in preset["gemm_table"])
        print(
            f"# against the datasheet ({preset['peak_flops'] / 1e12:.0f} TFLOP/s): the published models' GEMMs "
            f"{table}; attention {100 * preset['attention_efficiency']:.0f}%"
            + (f"; FP8 table of {len(preset['fp8_gemm_table'])} bins" if preset.get("fp8_gemm_table") else "")
        )
    print(f"# wrote {path}: netmorph plan estimate --hardware {path} ...; netmorph simulate step --hardware {path}")
