"""``netmorph mesh``: the rank grid and its process groups (Megatron's ``RankGenerator``)."""

from __future__ import annotations

from netmorph.cli import print_json
from netmorph.cli.flags import int_in
from netmorph.mesh import DIMS, Mesh


def add_parser(sub) -> None:
    p = sub.add_parser(
        "mesh",
        help="print the tp/cp/ep/dp/pp groups of a rank grid",
        description="Lay out --world ranks on a named grid (tp innermost, Megatron's "
        "tp-cp-ep-dp-pp order) and print the groups along each dimension.",
    )
    p.add_argument("--world", "-p", type=int_in(1, 1 << 20, "1..2**20"), required=True, help="ranks in the grid")
    for d in ("tp", "pp", "cp", "ep"):
        p.add_argument(f"--{d}", type=int, default=1, help=f"{d.upper()} size (default 1)")
    p.add_argument("--dp", type=int, help="DP size (default: world / (tp*cp*ep*pp))")
    p.add_argument("--order", default="tp-cp-ep-dp-pp", help="fastest-varying first (default tp-cp-ep-dp-pp)")
    p.add_argument("--rank", type=int, help="also show this rank's coordinates")
    p.add_argument("--json", action="store_true", help="print the groups as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    m = Mesh(args.world, tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, ep=args.ep, order=args.order)
    coords = m.coords(args.rank) if args.rank is not None else None  # a rank outside the mesh: one line
    if args.json:
        out = {"world": m.world, "order": "-".join(m.order), "sizes": m.sizes, "groups": {d: m.groups(d) for d in DIMS}}
        if coords is not None:
            out["coords"] = coords
        print_json(out)
        return 0
    print(f"{m}  ({m.world} ranks, order {'-'.join(m.order)}: {m.order[0]} varies fastest)")
    for d in m.shown():
        gs = m.groups(d)
        shown = ", ".join(str(g) for g in gs[:8]) + (f", ... ({len(gs)} groups)" if len(gs) > 8 else "")
        print(f"  {d.upper():>2} groups: {shown}")
    if coords is not None:
        print(f"  {m.describe(args.rank)}: " + " ".join(f"{d}={coords[d]}" for d in m.shown()))
    return 0
