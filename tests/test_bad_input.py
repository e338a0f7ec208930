"""Malformed values and files on every subcommand: exit 2 with one line naming the flag, never a
traceback, never an unbounded run (each case was a traceback or a hang before)."""

import json

import pytest

from netmorph.cli import main

CASES = [
    (["collective", "allreduce", "--world", "8", "--bytes", "1e30"], "--bytes"),
    (["collective", "allreduce", "--world", "100000", "--bytes", "1KiB"], "--world"),
    (["collective", "allreduce", "--world", "8", "--bytes", "1KiB", "--segments", "1000000000"], "--segments"),
    (["collective", "allreduce", "--world", "8", "--bytes", "1KiB", "--alpha", "nan"], "--alpha"),
    (["mesh", "--world", "1000000000"], "--world"),
    (["plan", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536", "--dp", "3"], "--dp"),
    (
        ["plan", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536", "--dp", "100000000000000000000"],
        "--dp",
    ),
    (["sgd", "--straggler", "1:inf", "--steps", "5"], "--straggler"),
    (["sgd", "--batch", "-5", "--steps", "5"], "--batch"),
    (["sgd", "--seed", "-1", "--steps", "5"], "--seed"),
    (["sgd", "--lr", "nan", "--steps", "5"], "--lr"),
    (["sgd", "--compare", "--plot", "/nonexistent/x.png", "--steps", "5"], "--plot"),
    (["bench", "allreduce", "--world", "2", "-b", "1e30", "-e", "1e30"], "--minbytes"),
    (["bench", "allreduce", "--world", "2", "-b", "1G", "-e", "1G"], "-e"),
    (["bench", "allreduce", "--world", "2", "-b", "64B"], "--minbytes"),
    (["bench", "allreduce", "--world", "2", "--bytes", "1KiB", "--timeout", "nan"], "--timeout"),
    (["bench", "allreduce", "--world", "2", "--bytes", "1KiB", "--timeout", "inf"], "--timeout"),
    (["sgd", "--jitter", "nan", "--steps", "5"], "--jitter"),
    (["sgd", "--compute-ms", "nan", "--steps", "5"], "--compute-ms"),
    (["train", "--compute-ms", "nan", "--steps", "1"], "--compute-ms"),
    (["collective", "allreduce", "--world", "4", "--bytes", "1KiB", "--alpha", "inf"], "--alpha"),
    (["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--ffn", "-5"], "--ffn"),
    (
        [
            "plan",
            "estimate",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--seq",
            "0",
            "--gpus",
            "1",
            "--global-batch",
            "1",
        ],
        "--seq",
    ),
    (
        [
            "plan",
            "estimate",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--vocab",
            "0",
            "--gpus",
            "1",
            "--global-batch",
            "1",
        ],
        "--vocab",
    ),
    (["train", "--steps=--"], "--steps"),
    (["sgd", "--compare", "--plot", "/proc/x.png", "--steps", "5"], "--plot"),
    (["train", "--trace", "/", "--steps", "1"], "--trace"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv,flag", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_bad_values_are_one_line_exit_2(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


FILES = [
    (b'{"alpha": "x", "beta": 1}', "alpha must be seconds in 0..1"),
    (b"[1, 2]", "one JSON object"),
    (b'{"alpha": 1e-6, "beta": 1e-9, "gpus_per_node": -4, "beta_inter": 1e-9}', "gpus_per_node"),
    (b'{"alpha": NaN, "beta": 1e-9}', "alpha must be a finite number, got NaN"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[" * 100000, "cannot read it as JSON"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("data,words", FILES, ids=[w for _, w in FILES])
def test_bad_topology_and_hardware_files(tmp_path, data, words, capsys):
    f = tmp_path / "t.json"
    f.write_bytes(data)
    assert main(["collective", "allreduce", "--world", "8", "--bytes", "1KiB", "--topology", str(f)]) == 2
    err = capsys.readouterr().err
    assert "--topology" in err and words in err and len(err.strip().splitlines()) == 1
    if words in ("one JSON object", "not UTF-8"):
        assert main(["plan", "estimate", "--model", "gpt3-175b", "--hardware", str(f)]) == 2
        assert "--hardware" in capsys.readouterr().err


HARDWARE = (
    '"peak_flops": 1e15, "memory_bytes": 8e10, "hbm_bandwidth": 3e12, "gpus_per_node": 8, '
    '"nvlink_bandwidth": 4.5e11, "nic_bandwidth": 5e10, "fp8_flops": 2e15'
)
HARDWARE_FIELDS = [  # each was a ZeroDivisionError / TypeError traceback, or an MFU over 100%, before
    ('"gemm_efficiency": 0', "gemm_efficiency"),
    ('"gemm_efficiency": true', "gemm_efficiency"),
    ('"fp8_gemm_efficiency": "fast"', "fp8_gemm_efficiency"),
    ('"fp8_gemm_efficiency": 1.5', "fp8_gemm_efficiency"),
    ('"attention_efficiency": -1', "attention_efficiency"),
    ('"peak_flops": "x"', "peak_flops"),
    ('"gpus_per_node": 2.5', "gpus_per_node"),
    ('"nvlink_bandwidth": NaN', "nvlink_bandwidth"),
    ('"elementwise_passes": -1', "elementwise_passes"),
    ('"alpha_inter": Infinity', "alpha_inter"),
    ('"name": 5', "name"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("extra,field", HARDWARE_FIELDS, ids=[e for e, _ in HARDWARE_FIELDS])
def test_bad_hardware_fields_are_one_line_naming_the_field(tmp_path, extra, field, capsys):
    f = tmp_path / "hw.json"
    argv = [
        "plan",
        "estimate",
        "--model",
        "llama-3-8b",
        "--hardware",
        str(f),
        "--dp",
        "8",
        "--global-batch",
        "64",
        "--precision",
        "fp8",
    ]
    f.write_text("{" + HARDWARE + "}")
    assert main(argv) == 0  # the file without the bad field is fine
    capsys.readouterr()
    f.write_text("{" + HARDWARE + ", " + extra + "}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--hardware" in err and field in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_devices_and_huge_files_are_refused_unread(tmp_path, capsys):
    assert main(["collective", "allreduce", "--world", "8", "--bytes", "1KiB", "--topology", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-9, "description": "x" * (2 << 20)}))
    assert main(["collective", "allreduce", "--world", "8", "--bytes", "1KiB", "--topology", str(big)]) == 2
    assert "at most" in capsys.readouterr().err


def _without_torch(*argv):
    """Run the CLI in a fresh interpreter where ``import torch`` fails, as on a machine without it."""
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; from netmorph.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
def test_without_torch_one_line_says_what_to_install():
    for argv in (
        ["train", "--steps", "1"],
        ["sgd", "--model", "mlp", "--steps", "2"],
        ["bench", "allreduce", "--world", "2", "-b", "1K", "--backend", "torch"],
    ):
        r = _without_torch(*argv)
        assert r.returncode == 3, (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "pip install torch" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_without_torch_bench_still_prints_what_it_measured():
    r = _without_torch(
        "bench", "allreduce", "--world", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--algo", "ring"
    )
    assert r.returncode == 0, r.stderr
    assert "needs torch" in r.stdout and "# Avg bus bandwidth" in r.stdout and "# algorithm ring" in r.stdout
    assert any(line.split()[:1] == ["1024"] for line in r.stdout.splitlines())
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--stepz", "3"], "did you mean --steps?"),
        (["tarin"], "did you mean 'train'?"),
        (["train", "--schedule", "1f1"], "did you mean '1f1b'?"),
        (
            ["simulate", "step", "--model", "ptdp-1.7b", "--dp", "2", "--global-batch", "4", "--trace-ranks", "0"],
            "add --trace",
        ),
        (["morph", "reshard", "--world", "4", "--from", "dp2,dp2", "--to", "tp2", "--steps", "1"], "dp is given twice"),
        (["plan", "estimate", "--params", "1e308", "--gpus", "8"], "--params must be in (0, 1e15]"),
        (["failures", "--job-mtbf", ""], "an empty value"),
        (["failures", "--checkpoint-write", "0"], "--checkpoint-write: must be more than 0"),
        (["serve", "--requests", ""], "argument --requests: an empty value"),
        (["sgd", "--slow-link", "0:1:1e308:1", "--steps", "2"], "ALPHA_US"),
        (["sgd", "--outer-momentum", "1", "--steps", "2"], "--outer-momentum"),
        # a vocabulary whose language does not fit even a row at a time: refused, not killed for memory
        (
            ["train", "--vocab", "100000000", "--steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2"],
            "--vocab",
        ),
    ],
)
def test_small_refusals_name_what_to_change(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_small_things_that_are_valid(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["failures", "--restart", "0", "--inplace-recovery", "0", "--trials", "5"]) == 0  # free recovery
    assert "restart 0 s" in capsys.readouterr().out
    assert main(["elastic", "--steps", "5", "--workers", "2", "--min-workers", "1"]) == 0  # no --compare
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--pp",
                "2",
                "--schedule",
                "gpipe",
                "--steps",
                "1",
                "--layers",
                "2",
                "--hidden",
                "16",
                "--heads",
                "2",
                "--seq",
                "8",
                "--vocab",
                "32",
            ]
        )
        == 0
    )
    assert "afab" in capsys.readouterr().out
    assert (
        main(
            [
                "train",
                "--zero",
                "1",
                "--steps",
                "1",
                "--layers",
                "1",
                "--hidden",
                "16",
                "--heads",
                "2",
                "--seq",
                "8",
                "--vocab",
                "32",
            ]
        )
        == 0
    )
    zero = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("#   zero"))
    assert "✓" in zero and "✗" not in zero  # 0 B sent, 0 B predicted at dp 1
    # GPT-2's vocabulary trains: past 4,096 the synthetic language is drawn a row at a time (its V x V table was
    # 20 GB, and the ranks were killed for memory)
    assert (
        main(
            [
                "train",
                "--vocab",
                "50257",
                "--steps",
                "1",
                "--layers",
                "1",
                "--hidden",
                "16",
                "--heads",
                "2",
                "--seq",
                "8",
            ]
        )
        == 0
    )
    assert "V50257" in capsys.readouterr().out


def test_serve_check_with_nothing_completed_is_not_a_pass(capsys):
    code = main(
        [
            "serve",
            "--requests",
            "4",
            "--context",
            "16",
            "--check",
            "2",
            "--kv-blocks",
            "1",
            "--block-size",
            "1",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--vocab",
            "32",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "nothing to check" in out and "0/0" not in out


@pytest.mark.parametrize(
    "argv,flag,near",
    [
        (["serve", "--swap-space", "x"], "--swap-space", None),
        (["moe", "--bogus", "3"], "--bogus", None),
        (["morph", "--wrld", "3"], "--wrld", "--world"),
        (["plan", "--gpu", "8", "estimate"], None, None),  # an unambiguous abbreviation is argparse's
        (["serve", "--requets", "4", "kv"], "--requets", "--requests"),
    ],
)
def test_an_unknown_flag_is_named_even_when_an_action_could_take_its_value(argv, flag, near, capsys):
    """The optional action word (serve run|kv|roofline, moe train|drops, ...) used to swallow the value after an
    unknown flag: ``serve --swap-space x`` said ``argument action: invalid choice: 'x'``."""
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    if flag is None:
        assert not any("unrecognized" in e for e in err)
        return
    assert code == 2 and len(err) == 1 and f"unrecognized argument: {flag}" in err[0] and "action" not in err[0], err
    assert near is None or f"did you mean {near}?" in err[0]


@pytest.mark.parametrize(
    "line,words",
    [
        ('{"prompt_len": 4, "output_len": 3}', "the field arrival_s is missing"),
        ('{"output_len": 3}', "the fields prompt_len, arrival_s are missing"),
        ('{"prompt_len": 4, "output_len": 3, "arrival_s": 0, "priorty": 1}', "unknown field 'priorty'"),
    ],
)
def test_a_workload_line_names_the_field_it_lacks(tmp_path, line, words, capsys):
    path = tmp_path / "w.jsonl"
    path.write_text(line + "\n")
    assert main(["serve", "--workload", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "KeyError" not in err[0] and '"arrival_s": seconds' in err[0], err


def test_the_model_shape_flags_are_one_definition_across_commands(capsys):
    """--layers/--num-layers and its siblings mean the same, with the same bounds, in every command that builds a
    GPT (cli/shape.py); what does not fit this machine is the budget's one line, not a range of the command's."""
    from netmorph.cli.shape import DEFAULTS

    for command in ("train", "moe", "morph", "serve", "plan"):
        argv = [command, "estimate"] if command == "plan" else [command]
        assert main([*argv, "--num-layers", "0"]) == 2
        err = capsys.readouterr().err
        assert "--layers/--num-layers: must be in 1..2**24, got 0" in err, (command, err)
        assert set(DEFAULTS[command]) <= {"layers", "hidden", "heads", "seq", "vocab"}
    for command in ("morph", "serve", "moe"):
        assert main([command, "--hidden", "100000"]) == 2
        err = capsys.readouterr().err
        assert "more than" in err and "lower" in err and len(err.strip().splitlines()) == 1, (command, err)
