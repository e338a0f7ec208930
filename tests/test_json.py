"""Every subcommand's ``--json`` is one JSON document that ``json.loads`` reads back, on the layouts the suite runs.

The trainer's own layouts are parsed back where they run (test_train: every dense and expert layout);
here every other subcommand and action, plus the trainer's expert runs from the command line (a run with
experts used to end in ``TypeError: keys must be str ...`` halfway through its output).
"""

import json

import pytest

from netmorph.cli import json_text, main

pytestmark = pytest.mark.timeout(120)

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32"]
CASES = {
    "collective": ["collective", "allreduce", "--world", "4", "--bytes", "1MiB", "--algo", "all", "--json"],
    "collective-sweep": ["collective", "alltoall", "--world", "3", "--sizes", "1KiB:4KiB", "--json"],
    "bench": [
        "bench",
        "allreduce",
        "--world",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "2",
        "-n",
        "2",
        "--algo",
        "ring",
        "--json",
    ],
    "bench-rooted": ["bench", "broadcast", "--world", "2", "-b", "1K", "-e", "1K", "-n", "2", "--no-compare", "--json"],
    "train-ep": ["train", "--dp", "2", "--ep", "2", "--experts", "4", "--top-k", "2", "--steps", "2", *TINY, "--json"],
    "train-tp-ep-check": [
        "train",
        "--tp",
        "2",
        "--dp",
        "2",
        "--ep",
        "2",
        "--experts",
        "4",
        "--top-k",
        "2",
        "--steps",
        "2",
        *TINY,
        "--check",
        "--json",
    ],
    "train-pp-check": [
        "train",
        "--pp",
        "2",
        "--schedule",
        "afab",
        "--microbatches",
        "4",
        "--steps",
        "2",
        *TINY,
        "--check",
        "--json",
    ],
    "moe": ["moe", "--steps", "2", "--ep", "2", "--experts", "4", "--json"],
    "moe-drops": ["moe", "drops", "--tokens", "64", "--experts", "4", "--trials", "5", "--json"],
    "elastic": ["elastic", "--workers", "2", "--steps", "4", "--json"],
    "serve": ["serve", "--requests", "4", "--json"],
    "serve-kv": ["serve", "kv", "--model", "opt-13b", "--tokens", "100", "--json"],
    "serve-roofline": ["serve", "roofline", "--model", "llama-3-8b", "--hardware", "a100-80g", "--json"],
    "failures": ["failures", "--gpus", "1024", "--per-gpu-mtbf", "1024h", "--trials", "5", "--json"],
    "failures-fleet": ["failures", "--fleet", "--json"],
    "sgd": ["sgd", "--mode", "ssp", "--workers", "2", "--steps", "4", "--compute-ms", "0", "--json"],
    "plan-estimate": [
        "plan",
        "estimate",
        "--model",
        "gpt3-175b",
        "--tp",
        "8",
        "--pp",
        "8",
        "--dp",
        "16",
        "--global-batch",
        "1536",
        "--json",
    ],
    "plan-search": [
        "plan",
        "search",
        "--model",
        "gpt3-175b",
        "--gpus",
        "1024",
        "--global-batch",
        "1536",
        "--top",
        "2",
        "--json",
    ],
    "simulate": [
        "simulate",
        "step",
        "--model",
        "gpt3-175b",
        "--tp",
        "8",
        "--pp",
        "8",
        "--dp",
        "16",
        "--global-batch",
        "1536",
        "--json",
    ],
    "morph": ["morph", "--world", "4", "--steps", "4", "--segment", "2", "--static", "1", "--json"],
    "morph-reshard": ["morph", "reshard", "--world", "4", "--steps", "1", "--json"],
    "mesh": ["mesh", "--world", "8", "--tp", "2", "--pp", "2", "--json"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_subcommand_json_parses_back(name, capsys):
    assert main(CASES[name]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # one document, nothing before or after it
    assert doc and out.count("\n") >= 1


def test_an_object_json_cannot_encode_is_refused_before_anything_is_printed(capsys):
    from netmorph.cli import print_json

    with pytest.raises(TypeError):
        print_json({"links": {("moe.dispatch", 1): 8}})
    assert capsys.readouterr().out == ""
    assert json.loads(json_text({"a": {1, 3, 2}})) == {"a": [1, 2, 3]}
