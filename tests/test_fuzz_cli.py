"""Every subcommand, every flag, driven with malformed values and files (hypothesis).

Each example puts one bad value on one flag of a small, fast command line and runs
``netmorph`` in-process: it must exit 0 (the value happened to be valid; for
``plan``, 1 when nothing fits) or 2 with
exactly one line on stderr naming a flag, never a traceback, and return quickly --
a value that would make the run unbounded must be refused up front, not run.
"""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netmorph.cli import _subparsers, build_parser, exact_int, finite_float, main, seed_int

# a small run of each subcommand: if a fuzzed value is valid, the run is still quick
BASE = {
    "collective": ["collective", "allreduce", "--world", "4", "--bytes", "1KiB"],
    "bench": ["bench", "allreduce", "--world", "2", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "--algo", "ring",
              "--no-compare", "--timeout", "5"],
    "train": ["train", "--steps", "1", "--layers", "1", "--hidden", "8", "--heads", "2", "--seq", "4", "--vocab",
              "16", "--timeout", "5"],
    "sgd": ["sgd", "--steps", "3", "--workers", "2", "--compute-ms", "0"],
    "plan": ["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64"],
    "mesh": ["mesh", "--world", "8", "--tp", "2"],
    "elastic": ["elastic", "--workers", "2", "--min-workers", "1", "--steps", "2", "--timeout", "5"],
    "simulate": ["simulate", "step", "--model", "ptdp-1.7b", "--dp", "2", "--global-batch", "4"],
    "serve": ["serve", "--requests", "3", "--context", "64", "--kv-blocks", "16", "--block-size", "4", "--layers", "1",
              "--hidden", "16", "--heads", "2", "--vocab", "32"],
    "failures": ["failures", "--gpus", "1024", "--trials", "5", "--days", "5"],
    "moe": ["moe", "--steps", "1", "--ep", "2", "--experts", "2", "--layers", "1", "--seq", "4", "--batch", "1",
            "--timeout", "5"],
    "morph": ["morph", "reshard", "--world", "2", "--from", "dp2", "--to", "tp2", "--steps", "1", "--layers", "2",
              "--hidden", "8", "--heads", "2", "--seq", "4", "--vocab", "16", "--global-batch", "2", "--timeout", "5"],
}
# flags whose valid values are paths to write (tested with unwritable places, not random text)
OUTPUTS = {"--plot", "--trace", "--out"}
# flags whose valid values are paths to read
INPUTS = {"--topology", "--hardware", "-t", "--workload"}

NUMBERS = ["nan", "NaN", "inf", "-inf", "1e30", "-1e30", "1e400", "-1", "-5", "-0.5", str(2 ** 70),
           str(-2 ** 63), "1e9", "0x10", "1_0", "", " ", "abc", "1:2:3", "٣", "1e", "--"]
SIZES = ["1e30", "-1", "1 PiB", "2PiB", "abc", "1KiBB", "nan", "inf", "", "1e400", "-1KiB", "8ZB"]


def _flags():
    """(subcommand, flag, argparse action) for every option that takes a value."""
    sub = _subparsers(build_parser())
    out = []
    for name, parser in sorted(sub.choices.items()):
        if name not in BASE:
            continue
        for action in parser._actions:
            if action.option_strings and action.nargs != 0 and action.dest != "help":
                out.append((name, action.option_strings[0], action))
    return out


FLAGS = _flags()


def _bad_files(tmp):
    paths = {}
    for stem, data in {"list": b"[1, 2]", "binary": b"\xff\xfe\x00", "deep": b"[" * 50000,
                       "nan": b'{"alpha": NaN, "beta": 1}', "strings": b'{"alpha": "x", "beta": "y"}',
                       "empty": b"", "negative": b'{"alpha": -1, "beta": -1e-9, "gpus_per_node": -8}'}.items():
        p = tmp / f"{stem}.json"
        p.write_bytes(data)
        paths[stem] = str(p)
    return list(paths.values()) + ["/dev/zero", "/nonexistent.json", str(tmp)]


def _value(flag, action, draw, files):
    if flag in OUTPUTS:
        return draw(st.sampled_from(["/nonexistent/dir/x.png", "/proc/x.json", "/"]))
    if flag in INPUTS:
        return draw(st.sampled_from(files))
    if action.type in (exact_int, finite_float, seed_int) or action.type is None and flag in ("--bytes", "-b", "-e", "-i",
                                                                                    "--sizes"):
        pool = SIZES if action.type is None else NUMBERS
        return draw(st.sampled_from(pool) | st.text(max_size=6))
    return draw(st.text(max_size=12) | st.sampled_from(["", "-1", "nan", "all", "x" * 300]))


@pytest.mark.timeout(600)
@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_flag_rejects_malformed_values_in_one_line(data, tmp_path_factory, capsys):
    files = _bad_files(tmp_path_factory.mktemp("bad"))
    name, flag, action = data.draw(st.sampled_from(FLAGS), label="flag")
    value = _value(flag, action, data.draw, files)
    argv = BASE[name] + [f"{flag}={value}" if value.startswith("-") else flag, *([] if value.startswith("-") else [value])]
    capsys.readouterr()
    t0 = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as e:            # argparse's own refusals
        code = e.code
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert "Traceback" not in err, (argv, err)
    nothing_fits = name == "plan" and code == 1 and "nothing fits" in out      # plan's documented "no answer"
    assert code in (0, 2) or nothing_fits, (argv, code, err)
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, (argv, err)
    assert elapsed < 60, (argv, f"{elapsed:.0f} s")
