"""Fuzz netmorph as an adversary would, and count what happens: every subcommand and flag, every config file's
fields, mismatched collective programs and stopped ranks (the cases are tests/fuzz.py's, which the suite samples).

    python scripts/fuzz.py [--cases 4000] [--seed 0] [--blames 40]

Prints one line per kind of case with its count per class (clean / traceback / unbounded / nonsense /
destroyed / leftover / bad output; for ranks: silent mismatches and wrong blames) and every non-clean case;
exit 1 if any. Then every output switch (--json, --trace, --plot) of every subcommand, alone and together.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import fuzz  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=4000, help="flag and config-file cases (default 4000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blames", type=int, default=40, help="stopped-rank cases (about 3 s each)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    counts = collections.defaultdict(collections.Counter)
    bad = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        paths = fuzz.specials(tmp)
        files = fuzz.bad_files(tmp)
        flags = fuzz.flags()
        configs = fuzz.config_cases()
        for i in range(args.cases):
            if i % 3 == 2:  # a third of the cases: a config file's field
                kind, path = rng.choice(configs)
                value = rng.choice(fuzz.BAD_JSON + fuzz.EITHER_JSON)
                cls, detail = fuzz.run_config(kind, path, value, tmp)
                counts[f"config {kind}"][cls] += 1
            else:
                name, flag, action = rng.choice(flags)
                value = fuzz.flag_value(rng, flag, action, tmp, paths, files)
                cls, detail = fuzz.run_flag(name, flag, action, value, tmp, paths)
                counts[f"flags {name}"][cls] += 1
            if cls != "clean":
                bad.append((cls, detail))
            if (i + 1) % 250 == 0:
                print(f"# {i + 1}/{args.cases} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        for name, switches in fuzz.switch_cases():  # every output switch of every subcommand
            cls, detail = fuzz.run_switches(name, switches, tmp)
            counts["output switches"][cls] += 1
            if cls != "clean":
                bad.append((cls, detail))
        for case in range(fuzz.MISMATCHES):
            for world in (2, 3, 4):
                for backend in ("local", "torch") if world <= 3 else ("local",):
                    cls, detail = fuzz.run_mismatch(case, world, backend)
                    counts["mismatched programs"][cls] += 1
                    if cls != "clean":
                        bad.append((cls, detail))
        for _ in range(args.blames):
            cls, detail = fuzz.run_blame(rng)
            counts["stopped ranks"][cls] += 1
            if cls != "clean":
                bad.append((cls, detail))
    total = collections.Counter()
    print(
        f"# netmorph fuzz: {args.cases} flag and config cases (seed {args.seed}), "
        f"{sum(counts['mismatched programs'].values())} mismatched programs, {args.blames} stopped ranks; "
        f"{time.monotonic() - t0:.0f} s"
    )
    print(f"{'kind':<24} {'cases':>6}  " + "  ".join(f"{c:>9}" for c in fuzz.CLASSES) + "  other")
    for kind in sorted(counts):
        c = counts[kind]
        total.update(c)
        other = ", ".join(f"{k} {v}" for k, v in c.items() if k not in fuzz.CLASSES)
        print(f"{kind:<24} {sum(c.values()):>6}  " + "  ".join(f"{c[k]:>9}" for k in fuzz.CLASSES) + f"  {other}")
    other = ", ".join(f"{k} {v}" for k, v in total.items() if k not in fuzz.CLASSES)
    print(f"{'all':<24} {sum(total.values()):>6}  " + "  ".join(f"{total[k]:>9}" for k in fuzz.CLASSES) + f"  {other}")
    for cls, detail in bad:
        print(f"{cls}: {detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
