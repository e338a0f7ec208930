"""`netmorph bench` as nccl-tests users drive it: -b/-e/-f/-i sweeps, -n/-w/-c/-o/-d/-r, footers, CSV."""

import csv
import io
import types

import pytest

from netmorph.cli import main
from netmorph.cli.bench import sizes_from
from netmorph.errors import UsageError
from netmorph.units import parse_nccl_size

pytestmark = pytest.mark.timeout(120)


def _sizes(**kw):
    base = dict(sizes=None, minbytes="32M", maxbytes="32M", stepfactor=1, stepbytes="1M")
    return sizes_from(types.SimpleNamespace(**{**base, **kw}))


def test_nccl_tests_sizes_and_defaults():
    """nccl-tests' parsesize reads a number and only the first letter after it: K, M, G, binary."""
    assert parse_nccl_size("128M") == 128 << 20 and parse_nccl_size("8K") == 8192 and parse_nccl_size("1G") == 1 << 30
    assert parse_nccl_size("1KB") == parse_nccl_size("1KiB") == parse_nccl_size("1k") == 1024
    assert parse_nccl_size("1.5K") == 1536
    for bad in ("64B", "1T", "", "x", "nan"):
        with pytest.raises(UsageError):
            parse_nccl_size(bad)
    assert _sizes() == [32 << 20]  # -b 32M -e 32M, nccl-tests' defaults
    assert _sizes(minbytes="8", maxbytes="128M", stepfactor=2) == [8 << k for k in range(25)]
    assert _sizes(minbytes="1K", maxbytes="64K", stepfactor=4) == [1024, 4096, 16384, 65536]
    assert _sizes(minbytes="1K", maxbytes="4K", stepbytes="1K") == [1024, 2048, 3072, 4096]
    assert _sizes(minbytes="1M", maxbytes="3M") == [1 << 20, 2 << 20, 3 << 20]  # no -f: 1M steps (-i)
    assert _sizes(sizes="1KiB:4KiB") == [1024, 2048, 4096]
    for kw in (
        dict(minbytes="8K", maxbytes="1K"),
        dict(minbytes="8", maxbytes="1G", stepbytes="1"),
        dict(stepfactor=0),
    ):
        with pytest.raises(UsageError):
            _sizes(**kw)


# nccl-tests' own lines (NVIDIA/nccl-tests v2.19.6, src/util.cu writeResultHeader / writeBenchmarkLinePreamble /
# writeBenchmarkLineBody / writeResultFooter), trailing spaces included
NCCL_HEADER = [
    "#",
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ",
]
NCCL_ROWS = [
    (
        "        1024           256     float     sum      -1     5.45    0.19    0.33       0     5.35    0.19    0.33       0",
        dict(
            op="allreduce",
            bytes=1024,
            count=256,
            type="float32",
            redop="sum",
            root=0,
            time_s=5.45e-6,
            algbw_gbps=0.19,
            busbw_gbps=0.33,
            wrong=0,
            in_place_time_s=5.35e-6,
            in_place_algbw_gbps=0.19,
            in_place_busbw_gbps=0.33,
            in_place_wrong=0,
        ),
    ),
    (
        "   134217728      33554432     float    none       0  1568.30   85.58   85.58       0  1560.90   85.99   85.99       0",
        dict(
            op="broadcast",
            bytes=134217728,
            count=33554432,
            type="float32",
            redop="sum",
            root=0,
            time_s=1568.3e-6,
            algbw_gbps=85.58,
            busbw_gbps=85.58,
            wrong=0,
            in_place_time_s=1560.9e-6,
            in_place_algbw_gbps=85.99,
            in_place_busbw_gbps=85.99,
            in_place_wrong=0,
        ),
    ),
    (
        "         768            64  bfloat16    none      -1    22.41    0.03    0.03       0    21.92    0.04    0.03    N/A",
        dict(
            op="alltoall",
            bytes=768,
            count=64,
            type="bfloat16",
            redop="sum",
            root=0,
            time_s=22.41e-6,
            algbw_gbps=0.0342,
            busbw_gbps=0.0285,
            wrong=0,
            in_place_time_s=21.92e-6,
            in_place_algbw_gbps=0.035,
            in_place_busbw_gbps=0.0292,
            in_place_wrong=-1,
        ),
    ),
]


def test_the_table_is_nccl_tests_character_for_character():
    from netmorph.report.table import nccl_float, nccl_footer, nccl_header, nccl_row

    assert nccl_header() == NCCL_HEADER
    for line, rec in NCCL_ROWS:
        assert nccl_row(rec) == line
    assert nccl_footer([NCCL_ROWS[0][1]], "all_reduce_perf") == [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 0.33 ",
        "#",
        "# Collective test concluded: all_reduce_perf",
    ]
    # getFloatStr: two decimals while they fit, then one, none, an exponent
    assert [nccl_float(x, 7) for x in (5.4567, 12345.67, 123456.7, 12345678.0)] == [
        "   5.46",
        "12345.7",
        " 123457",
        "1.2e+07",
    ]


def test_a_sweep_prints_one_nccl_tests_table_per_algorithm(capsys):
    code = main(
        ["bench", "allreduce", "-g", "2", "-b", "8", "-e", "128K", "-f", "16", "-n", "2", "-w", "0", "--algo", "ring"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n".join(NCCL_HEADER[1:])) == 2  # ring, then gloo
    rows = [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert [(int(r[0]), r[2], r[3], r[4]) for r in rows] == [
        (n, "float", "sum", "-1") for _ in range(2) for n in (8, 128, 2048, 32768)
    ]
    assert all(r[8] == "0" and r[12] == "0" for r in rows)  # #wrong, out of place and in place
    assert (
        out.count("# Out of bounds values : 0 OK") == 2
        and out.count("# Collective test concluded: all_reduce_perf") == 2
    )
    assert "# nThread 1 nGpus 2 minBytes 8 maxBytes 131072 step: 16(factor) warmup iters: 0 iters: 2" in out


def test_every_type_op_and_root_checks_out(capsys):
    code = main(
        [
            "bench",
            "reduce",
            "-g",
            "3",
            "-b",
            "1000",
            "-e",
            "1000",
            "-o",
            "all",
            "-r",
            "all",
            "-d",
            "all",
            "-n",
            "1",
            "-w",
            "0",
            "-c",
            "2",
            "--algo",
            "binomial",
            "--no-compare",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "# Out of bounds values : 0 OK" in out
    rows = [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]
    want = {
        (t, o, r)
        for t in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16")
        for o in ("sum", "prod", "max", "min", "avg")
        for r in ("0", "1", "2")
        if o != "avg" or t in ("half", "float", "double", "bfloat16")
    }
    assert {(r[2], r[3], r[4]) for r in rows} == want
    counts = {r[2]: int(r[1]) for r in rows}
    assert counts["int8"] == 1000 and counts["double"] == 125 and counts["bfloat16"] == 500


@pytest.mark.parametrize(
    "op, count, size", [("allgather", 80, 960), ("reduce_scatter", 80, 960), ("alltoall", 80, 960)]
)
def test_split_collectives_count_per_rank_as_nccl_tests(op, count, size, capsys):
    """-b 1000 of float at 3 ranks: 83 elements each, rounded down to 16 bytes' worth (4): 80 per rank."""
    assert (
        main(
            ["bench", op, "-g", "3", "-b", "1000", "-e", "1000", "-n", "1", "-w", "0", "--algo", "auto", "--no-compare"]
        )
        == 0
    )
    row = next(ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#"))
    assert (int(row[0]), int(row[1])) == (size, count)
    assert row[-1] == ("N/A" if op == "alltoall" else "0")  # in-place all-to-all: not checked


def test_check_off_and_csv(capsys):
    assert (
        main(
            [
                "bench",
                "allgather",
                "--world",
                "2",
                "-b",
                "64",
                "-e",
                "256",
                "-f",
                "2",
                "-c",
                "0",
                "-n",
                "1",
                "-w",
                "0",
                "--algo",
                "ring",
                "--no-compare",
                "--csv",
            ]
        )
        == 0
    )
    recs = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["bytes"]) for r in recs] == [64, 128, 256] and all(r["wrong"] == "-1" for r in recs)
    assert (
        main(
            [
                "bench",
                "allgather",
                "--world",
                "2",
                "-b",
                "64",
                "-e",
                "64",
                "-c",
                "0",
                "-n",
                "1",
                "--algo",
                "ring",
                "--no-compare",
            ]
        )
        == 0
    )
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#"))
    assert row.endswith("    N/A") and row.count("N/A") == 2


def test_bench_runs_bfloat16_and_half_on_the_local_fabric(capsys):
    for t in ("bfloat16", "half"):
        assert (
            main(
                [
                    "bench",
                    "allreduce",
                    "-g",
                    "2",
                    "-b",
                    "4K",
                    "-e",
                    "4K",
                    "-d",
                    t,
                    "-n",
                    "1",
                    "-w",
                    "0",
                    "--algo",
                    "ring",
                ]
            )
            == 0
        )
        out = capsys.readouterr().out
        assert out.count("# Out of bounds values : 0 OK") == 2 and f" {t} " in out


def test_nccl_tests_flags_that_change_nothing_here_are_accepted_and_world_is_not_p(capsys):
    assert (
        main(
            [
                "bench",
                "allreduce",
                "-b",
                "64",
                "-e",
                "64",
                "-p",
                "1",
                "-t",
                "1",
                "-g",
                "2",
                "-n",
                "1",
                "-w",
                "0",
                "--algo",
                "ring",
                "--no-compare",
            ]
        )
        == 0
    )
    assert "2 ranks" in capsys.readouterr().out
    assert main(["bench", "allreduce", "-d", "uint32", "--backend", "torch", "-g", "2"]) == 2
    assert "gloo has no uint32" in capsys.readouterr().err
    assert main(["bench", "allreduce", "-o", "avg", "-d", "int32", "-g", "2"]) == 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torch", "torch-native"])
def test_bench_under_torchrun_joins_the_job_and_rank_0_prints(backend, tmp_path):
    """nccl-tests runs under the cluster's launcher; so does `netmorph bench`: one table, from rank 0."""
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "netmorph",
            "bench",
            "allreduce",
            "-b",
            "8",
            "-e",
            "8K",
            "-f",
            "32",
            "--backend",
            backend,
            "--algo",
            "ring",
            "-n",
            "3",
            "-w",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # torchrun's torchelastic_* log folder
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert out.count("# netmorph bench allreduce: 2 ranks") == 1  # rank 1 prints nothing
    sizes = [int(line.split()[0]) for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert sizes == [8, 256, 8192]
    assert "# Out of bounds values : 0 OK" in out and "# Avg bus bandwidth" in out


def test_bench_under_torchrun_refuses_what_cannot_work(monkeypatch, capsys):
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(k, v)
    assert main(["bench", "allreduce", "-b", "8", "--backend", "local"]) == 2
    assert "under torchrun use --backend torch" in capsys.readouterr().err
    assert main(["bench", "allreduce", "-b", "8", "--world", "4"]) == 2
    assert "WORLD_SIZE 2" in capsys.readouterr().err
