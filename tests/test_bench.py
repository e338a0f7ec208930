"""`netmorph bench` as nccl-tests users drive it: -b/-e/-f/-i sweeps, -n/-w/-c/-o/-d/-r, footers, CSV."""

import csv
import io
import types

import pytest

from netmorph.cli import main
from netmorph.cli.bench import sizes_from
from netmorph.errors import UsageError
from netmorph.units import parse_size

pytestmark = pytest.mark.timeout(120)


def _sizes(**kw):
    base = dict(sizes=None, bytes=None, maxbytes=None, stepfactor=None, stepbytes=None)
    return sizes_from(types.SimpleNamespace(**{**base, **kw}))


def test_nccl_tests_sizes():
    assert parse_size("128M") == 128 << 20 and parse_size("8K") == 8192 and parse_size("1G") == 1 << 30
    assert parse_size("128MB") == 128 * 10**6 and parse_size("1KiB") == 1024
    assert _sizes(bytes="8", maxbytes="128M") == [8 << k for k in range(25)]
    assert _sizes(bytes="1K", maxbytes="64K", stepfactor=4) == [1024, 4096, 16384, 65536]
    assert _sizes(bytes="1K", maxbytes="4K", stepbytes="1K") == [1024, 2048, 3072, 4096]
    assert _sizes(bytes="4096") == [4096]
    assert _sizes(sizes="1KiB:4KiB") == [1024, 2048, 4096]
    for kw in (dict(bytes="8K", maxbytes="1K"), dict(bytes="1K", maxbytes="8K", stepfactor=2, stepbytes="1K"),
               dict(bytes="1K", maxbytes="8K", stepfactor=1), dict(), dict(sizes="1K:2K", bytes="1K")):
        with pytest.raises(UsageError):
            _sizes(**kw)


def test_sweep_prints_every_row_and_the_footers(capsys):
    code = main(["bench", "allreduce", "-p", "2", "-b", "8", "-e", "128K", "-f", "16", "-n", "2", "-w", "0",
                 "--algo", "ring"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [l.split() for l in out.splitlines() if not l.startswith("#")]
    assert [(int(r[0]), r[3], r[4]) for r in rows] == [(n, a, b) for n in (8, 128, 2048, 32768)
                                                       for a, b in (("ring", "local"), ("native", "torch-native"))]
    assert all(r[8] == "0" for r in rows)                       # #wrong
    assert "# Out of bounds values : 0 OK" in out
    assert "# Avg bus bandwidth    : " in out and "(ring, local, 4 sizes)" in out


def test_reduction_op_root_and_type(capsys):
    code = main(["bench", "reduce", "-p", "3", "-b", "1K", "-o", "max", "-r", "2", "-d", "int32", "-n", "2",
                 "--algo", "binomial", "--no-compare"])
    out = capsys.readouterr().out
    assert code == 0 and "redop max, root 2" in out and " int32 " in out
    assert "# Out of bounds values : 0 OK" in out
    for op in ("min", "prod"):
        assert main(["bench", "allreduce", "-p", "3", "-b", "1200", "-o", op, "-n", "1", "--algo", "ring",
                     "--no-compare"]) == 0
        assert "0 OK" in capsys.readouterr().out


def test_check_off_and_csv(capsys):
    assert main(["bench", "allgather", "-p", "2", "-b", "64", "-e", "256", "-c", "0", "-n", "1", "-w", "0",
                 "--algo", "ring", "--no-compare", "--csv"]) == 0
    recs = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["bytes"]) for r in recs] == [64, 128, 256] and all(r["wrong"] == "-1" for r in recs)
    assert main(["bench", "allgather", "-p", "2", "-b", "64", "-c", "0", "-n", "1", "--algo", "ring",
                 "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "N/A (--check 0)" in out and " N/A " in [l for l in out.splitlines() if not l.startswith("#")][0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torch", "torch-native"])
def test_bench_under_torchrun_joins_the_job_and_rank_0_prints(backend):
    """nccl-tests runs under the cluster's launcher; so does `netmorph bench`: one table, from rank 0."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "netmorph",
                        "bench", "allreduce", "-b", "8", "-e", "8K", "-f", "32", "--backend", backend,
                        "--algo", "ring", "-n", "3", "-w", "1"],
                       capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert out.count("# netmorph bench allreduce: world 2") == 1          # rank 1 prints nothing
    sizes = [int(line.split()[0]) for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert sizes == [8, 256, 8192]
    assert "# Out of bounds values : 0 OK" in out and "# Avg bus bandwidth" in out


def test_bench_under_torchrun_refuses_what_cannot_work(monkeypatch, capsys):
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    assert main(["bench", "allreduce", "-b", "8", "--backend", "local"]) == 2
    assert "under torchrun use --backend torch" in capsys.readouterr().err
    assert main(["bench", "allreduce", "-b", "8", "--world", "4"]) == 2
    assert "WORLD_SIZE 2" in capsys.readouterr().err
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k)
    assert main(["bench", "allreduce", "-b", "8"]) == 2
    assert "--world is required" in capsys.readouterr().err
