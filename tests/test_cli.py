"""The command line as a user meets it: tables, JSON, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from netmorph.cli import main
from netmorph.collectives import ALGORITHMS


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_allreduce_all_table(capsys):
    code, out, err = run(capsys, "collective", "allreduce", "--world", "8", "--bytes", "8MiB", "--algo", "all",
                         "--formula")
    assert code == 0 and err == ""
    rows = [l for l in out.splitlines() if not l.startswith("#")]
    assert len(rows) == len(ALGORITHMS["allreduce"]) == 8
    ring = next(l for l in rows if " ring " in l)
    assert "14,680,064" in ring and "117,440,512" in ring and " 14 " in ring and " 112 " in ring
    assert out.count("✓") >= 15 and "✗" not in out
    assert "*rabenseifner" in out                      # fastest marked


def test_json_keys_and_auto(capsys):
    code, out, _ = run(capsys, "collective", "allreduce", "-p", "8", "--sizes", "1KiB:1GiB", "--algo", "auto",
                       "--json")
    recs = json.loads(out)
    assert code == 0 and len(recs) == 21
    for r in recs:
        for k in ("op", "algo", "world", "bytes", "rounds", "messages", "bytes_on_wire", "bytes_sent_per_rank",
                  "bytes_reduced_per_rank", "predicted_time_s"):
            assert k in r
        assert r["auto"] is True and r["reason"]
    algos = [r["algo"] for r in recs]
    assert algos[0] == "recursive_doubling" and algos[-1] in ("rabenseifner", "ring")


@pytest.mark.parametrize("op", ["allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"])
def test_every_op_runs(capsys, op):
    code, out, _ = run(capsys, "collective", op, "--world", "6", "--bytes", "1MiB", "--topology",
                       "dgx-a100-cluster", "--root", "2")
    assert code == 0 and "dgx-a100-cluster" in out


def test_alpha_beta_override(capsys):
    code, out, _ = run(capsys, "collective", "allreduce", "-p", "4", "-b", "1MB", "--algo", "ring",
                       "--alpha", "0", "--beta", "1e-10", "--json")
    (rec,) = json.loads(out)
    assert rec["predicted_time_s"] == pytest.approx(2 * 1e6 * 3 / 4 * 1e-10)


def test_topology_json_file(capsys, tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-10, "gpus_per_node": 4, "alpha_inter": 1e-5,
                             "beta_inter": 1e-9}))
    code, out, _ = run(capsys, "collective", "allreduce", "-p", "8", "-b", "1MiB", "-t", str(f), "--json")
    assert code == 0 and json.loads(out)[0]["topology"] == "mine"


@pytest.mark.parametrize("argv,needle", [
    (["collective", "allreduse", "-p", "8", "-b", "1MiB"], "unknown op"),
    (["collective", "allreduce", "-p", "8", "-b", "1MiB", "--algo", "fast"], "--algo"),
    (["collective", "allreduce", "-p", "0", "-b", "1MiB"], "--world"),
    (["collective", "allreduce", "-p", "8", "-b", "-5"], "--bytes"),
    (["collective", "allreduce", "-p", "8", "-b", "12XB"], "--bytes"),
    (["collective", "allreduce", "-p", "8", "-b", "6"], "float32"),
    (["collective", "allreduce", "-p", "16", "-b", "1MiB", "-t", "dgx-a100"], "--world 16"),
    (["collective", "allreduce", "-p", "8", "-b", "1MiB", "-t", "nowhere"], "--topology"),
    (["collective", "broadcast", "-p", "8", "-b", "1MiB", "--root", "9"], "--root"),
    (["collective", "allgather", "-p", "8", "-b", "1MiB", "--segments", "4"], "--segments"),
    (["collective", "allreduce", "-p", "8", "-b", "1MiB", "--sizes", "1:2"], "not allowed"),
    (["mesh", "--world", "16", "--tp", "3"], "--world 16"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(argv))
    out, err = capsys.readouterr()
    assert e.value.code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.timeout(60)
def test_console_script_bad_input_has_no_traceback():
    r = subprocess.run([sys.executable, "-m", "netmorph", "collective", "allreduce", "--world", "8",
                        "--bytes", "lots"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--bytes" in r.stderr


def test_mesh_command(capsys):
    code, out, _ = run(capsys, "mesh", "--world", "16", "--tp", "2", "--pp", "4", "--rank", "3")
    assert code == 0 and "TP(2)-PP(4)-DP(2)" in out and "[0, 4, 8, 12]" in out and "tp=1 pp=0 dp=1" in out


@pytest.mark.timeout(120)
def test_tour_writes_report(tmp_path, capsys):
    code, out, _ = run(capsys, "tour", "--out", str(tmp_path / "rep"))
    assert code == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    for png in ("allreduce_tp_vs_dp.png", "allreduce_winner_map.png", "allreduce_rounds_bytes.png"):
        assert (tmp_path / "rep" / png).stat().st_size > 10_000
        assert png in page
    assert "TP all-reduce" in out and "recursive_doubling" in out
