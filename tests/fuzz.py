"""Hostile input for every subcommand, every flag and every config file's fields, and what each run is classed as.

Shared by ``tests/test_fuzz_cli.py`` (a bounded sample in the suite) and ``scripts/fuzz.py`` (thousands of
cases, counted per class). A case puts one bad value on one flag of a small, fast command line, or one bad
value in one field of a config file the command reads, runs ``netmorph`` in-process and is classed:

- ``clean``: exit 0 with a value that may be valid, exit 2 with exactly one line on stderr, or a documented
  non-zero answer (``plan``: 1 when nothing fits);
- ``traceback``: a traceback on stderr, or an exception out of ``main``;
- ``unbounded``: still running after :data:`LIMIT` seconds (interrupted by an alarm);
- ``nonsense``: exit 0 with a value that cannot be valid (NaN, infinity, a negative size, text for a
  number, a boolean for a count...);
- ``destroyed``: an output path that was a FIFO, socket, folder or device node is no longer one;
- ``leftover``: a process, shared-memory segment or temporary file the case started is still there after it;
- ``bad output``: an output switch (``--json``, ``--trace``, ``--plot``) asked of a run that exited 0 did not
  give what it promises (one JSON document on stdout, a JSON trace, a PNG).

``unbounded`` also covers memory: a case whose processes hold more than :data:`MEMORY_CAP` resident is stopped
like one past the time limit. Size flags whose cost is implied (``--world 16384``, ``--bytes 1GiB``, ``--sizes
1KiB:1GiB``) are drawn with valid but huge values (:data:`IMPLIED`): a run must refuse them in one line or
finish within both limits -- with the machine's hour scaled to :data:`BUDGET_SHARE` of the limit, so that what the
estimate lets through is what the case times.

Two more kinds of case run ranks: ``mismatch`` (ranks whose calls disagree: a pass is a named
CollectiveMismatch or Deadlock, never success) and ``blame`` (a rank SIGSTOPped mid-step in a random
layout: a pass names it as the root cause).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

from netmorph.cli import _subparsers, build_parser, main
from netmorph.cli.flags import exact_int, finite_float, seed_int, timeout_seconds
from netmorph.elastic.launcher import descendants

LIMIT = 60.0  # seconds a case may run before it counts as unbounded
# the machine's budget for a run (an hour: runtime.budget.MAX_SECONDS) is this much of LIMIT during a case, so a
# run the estimate lets through must finish within the limit: the estimate itself is under test
BUDGET_SHARE = 0.25
MEMORY_CAP = 6 << 30  # bytes resident (this process and its children) before a case counts as unbounded
CLASSES = ("clean", "traceback", "unbounded", "nonsense", "destroyed", "leftover", "bad output")

# a small run of each subcommand: if a fuzzed value is valid, the run is still quick
BASE = {
    "collective": ["collective", "allreduce", "--world", "4", "--bytes", "1KiB"],
    "bench": [
        "bench",
        "allreduce",
        "--world",
        "2",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
        "-w",
        "0",
        "--algo",
        "ring",
        "--no-compare",
        "--timeout",
        "5",
    ],
    "train": [
        "train",
        "--steps",
        "1",
        "--layers",
        "1",
        "--hidden",
        "8",
        "--heads",
        "2",
        "--seq",
        "4",
        "--vocab",
        "16",
        "--timeout",
        "5",
    ],
    "sgd": ["sgd", "--steps", "3", "--workers", "2", "--compute-ms", "0"],
    "plan": ["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64"],
    "mesh": ["mesh", "--world", "8", "--tp", "2"],
    "elastic": ["elastic", "--workers", "2", "--min-workers", "1", "--steps", "2", "--timeout", "5"],
    "simulate": ["simulate", "step", "--model", "ptdp-1.7b", "--dp", "2", "--global-batch", "4"],
    "serve": [
        "serve",
        "--requests",
        "3",
        "--context",
        "64",
        "--kv-blocks",
        "16",
        "--block-size",
        "4",
        "--layers",
        "1",
        "--hidden",
        "16",
        "--heads",
        "2",
        "--vocab",
        "32",
    ],
    "failures": ["failures", "--gpus", "1024", "--trials", "5", "--days", "5"],
    "moe": [
        "moe",
        "--steps",
        "1",
        "--ep",
        "2",
        "--experts",
        "2",
        "--layers",
        "1",
        "--seq",
        "4",
        "--batch",
        "1",
        "--timeout",
        "5",
    ],
    # a cluster of one torchrun job of one worker (the flags go before the --), and the lighthouse on a free port
    "launch": ["launch", "--nodes", "1", "--nproc-per-node", "1", "--", "elastic", "--steps", "2", "--timeout", "5"],
    "lighthouse": ["lighthouse", "--host", "127.0.0.1", "--port", "{port}"],
    "morph": [
        "morph",
        "reshard",
        "--world",
        "2",
        "--from",
        "dp2",
        "--to",
        "tp2",
        "--steps",
        "1",
        "--layers",
        "2",
        "--hidden",
        "8",
        "--heads",
        "2",
        "--seq",
        "4",
        "--vocab",
        "16",
        "--global-batch",
        "2",
        "--timeout",
        "5",
    ],
}
# run as a user runs them, each in its own process: they start process trees and own SIGINT and SIGTERM
PROCESSES = {"launch", "lighthouse"}
SERVES = {"lighthouse": 3.0}  # runs until stopped: SIGINT after this long must end it, exit 0, nothing left
OUTPUTS = {"--plot", "--trace", "--out"}  # flags whose values are paths to write
INPUTS = {"--topology", "--hardware", "-t", "--workload", "--model-config", "--deepspeed-config"}
SKIP = {"--megatron-args"}  # fuzzed through its own cases (config kind)

# values no flag takes: a run that exits 0 with one of these accepted nonsense
INVALID = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1",
    "-5",
    "-0.5",
    "-1e30",
    str(-(2**63)),
    str(2**70),
    "",
    " ",
    "abc",
    "1e",
    "--",
    "1:2:3",
    "0x10",
]
MAYBE = ["0", "1", "2", "1e9", "1e30", "1_0", "٣", "all", "x" * 300, "3.5", "64", "1K", "8MiB"]
SIZES = ["1e30", "-1", "1 PiB", "2PiB", "abc", "1KiBB", "nan", "inf", "", "1e400", "-1KiB", "8ZB", "64B"]
# valid values whose memory or time the command must hold against this machine (dest -> values)
IMPLIED = {
    "world": ["16384", "10000", "4096", "1024", "512", "65", "64"],
    "bytes": ["1GiB", "16GiB", "1TiB", "512MiB"],
    "sizes": ["1KiB:1GiB", "1:1TiB", "1KiB:16GiB"],
    "minbytes": ["1G", "16G"],
    "maxbytes": ["1G", "16G"],
    "workers": ["64", "512"],
    "requests": ["100000"],
    "steps": ["100000", "1000000"],
    "gpus": ["1048576", "16384"],
    "trials": ["1000000"],
    "tokens": ["1000000000"],
}

# output switches per subcommand: a run with them that exits 0 must give what they promise
SWITCHES = {
    "collective": ("--json",),
    "bench": ("--json",),
    "train": ("--json", "--trace"),
    "sgd": ("--json", "--plot"),
    "plan": ("--json",),
    "mesh": ("--json",),
    "elastic": ("--json", "--plot"),
    "simulate": ("--json", "--trace"),
    "serve": ("--json",),
    "failures": ("--json", "--plot"),
    "moe": ("--json", "--plot"),
    "morph": ("--json", "--plot"),
}


def flags():
    """(subcommand, flag, argparse action) for every option that takes a value."""
    sub = _subparsers(build_parser())
    out = []
    for name, parser in sorted(sub.choices.items()):
        if name not in BASE:
            continue
        for action in parser._actions:
            if (
                action.option_strings
                and action.nargs != 0
                and action.dest != "help"
                and action.option_strings[0] not in SKIP
            ):
                out.append((name, action.option_strings[0], action))
    return out


# ---------------------------------------------------------------------------------------------- running
class Unbounded(BaseException):
    """Raised by the alarm when a case runs past LIMIT (a BaseException: main must not swallow it)."""


def _resident(pids) -> int:
    """Bytes the processes hold, each shared page counted once over its sharers (PSS: forked ranks share their
    parent's torch pages, which an RSS sum counts once per rank)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("Pss:")) * 1024
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return total


def _memory_watch(stop: threading.Event, hit: list, cap: int) -> None:
    """Poll this process's and its children's resident memory; past ``cap``, stop the case as the alarm does."""
    me = os.getpid()
    while not stop.wait(0.2):
        if _resident([me] + descendants(me)) > cap:
            hit.append(True)
            os.kill(me, signal.SIGALRM)
            return


def run(argv, limit: float = LIMIT, cap: int = MEMORY_CAP, out: list | None = None):
    """(exit code, stderr, seconds, escaped exception or None) of ``netmorph argv`` in this process; "unbounded"
    for the code past ``limit`` seconds or ``cap`` bytes resident. ``out``: append stdout to it."""
    hit = []

    def alarm(signum, frame):
        raise Unbounded("memory" if hit else "time")

    from netmorph.runtime import budget

    private = scratch_dir()
    tmp_before, tempfile.tempdir = tempfile.tempdir, private  # what a case leaves is seen in a folder of its own
    env_before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = private
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    hour, budget.MAX_SECONDS = budget.MAX_SECONDS, BUDGET_SHARE * limit
    stop = threading.Event()
    watch = threading.Thread(target=_memory_watch, args=(stop, hit, cap), daemon=True)
    watch.start()
    err, stdout, escaped, code = io.StringIO(), io.StringIO(), None, None
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
            code = main(argv)
    except SystemExit as e:
        code = e.code
    except Unbounded:
        code = "unbounded"
    except BaseException as e:  # noqa: BLE001 - an exception out of main is the finding
        escaped = e
    finally:
        tempfile.tempdir = tmp_before
        if env_before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = env_before
        budget.MAX_SECONDS = hour
        stop.set()
        watch.join()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if out is not None:
        out.append(stdout.getvalue())
    return code, err.getvalue(), time.monotonic() - t0, escaped


# ---------------------------------------------------------------------------------------------- leftovers
def shm_names() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _held_shm() -> set:
    """The ``/dev/shm`` names some other live process maps or holds open (``/proc/PID/maps`` and ``fd``): a named
    semaphore or segment another test worker is using right now, under ``pytest -n``. This process is not
    counted: a name the test's own process still holds is the test's."""
    held = set()
    for pid in set(filter(str.isdigit, os.listdir("/proc"))) - {str(os.getpid())}:
        try:
            with open(f"/proc/{pid}/maps") as f:
                held.update(m.split("/dev/shm/", 1)[1].split()[0] for m in f if "/dev/shm/" in m)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/") :].split()[0])
        except OSError:  # the process ended while we read it, or is not ours to read
            continue
    return held


def orphaned_shm(before: set) -> set:
    """The ``/dev/shm`` names made since ``before`` that no live process holds: what a case leaked. A name a
    process still maps belongs to that process (a test worker beside us, or a survivor the process check names)."""
    new = shm_names() - before
    return new - _held_shm() if new else new


_SCRATCH = []


def scratch_dir() -> str:
    """This process's temporary directory for the cases (made once): every case runs with it as the temporary
    directory, so what a case leaves there is the case's -- not another test worker's, running beside it."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="fuzz-tmp-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def _temporaries() -> set:
    """Everything in the cases' temporary directory: store folders, inductor caches, checkpoints, temporary output
    files."""
    try:
        return set(os.listdir(scratch_dir()))
    except OSError:
        return set()


def snapshot() -> tuple:
    return shm_names(), _temporaries(), set(descendants(os.getpid()))


def leftovers(before: tuple, grace: float = 2.0) -> str:
    """What a case left behind compared with ``before`` (processes get ``grace`` seconds to be reaped); ""
    when nothing."""
    deadline = time.monotonic() + grace
    while True:
        new = (orphaned_shm(before[0]), _temporaries() - before[1], set(descendants(os.getpid())) - before[2])
        if not any(new) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return "; ".join(
        f"{what}: {sorted(map(str, n))[:5]}"
        for what, n in zip(("shared memory", "temporary files", "processes"), new)
        if n
    )


def classify(name: str, code, err: str, escaped, invalid: bool) -> str:
    if code == "unbounded":
        return "unbounded"
    if escaped is not None or "Traceback" in err:
        return "traceback"
    if code == 0:
        return "nonsense" if invalid else "clean"
    if code == 2:  # one line (launch's banner, the commands a cluster runs, before it)
        lines = [ln for ln in err.splitlines() if ln.strip() and not (name == "launch" and ln.startswith("#"))]
        return "clean" if len(lines) == 1 else "traceback"
    if name == "plan" and code == 1:
        return "clean"  # "nothing fits": plan's documented answer
    if name == "serve" and code == 1 and "check" in err:
        return "clean"
    return "traceback"  # exit 1 from a rank failure, 3, ... on hostile input: a crash path


# ---------------------------------------------------------------------------------------------- special paths
def specials(tmp, exts=(".png", ".json")) -> dict:
    """Things that exist and are not regular files, each under a name a writer would take, with their kind:
    what an output flag must never replace."""
    out = {}
    for ext in exts:
        fifo = os.path.join(tmp, f"fifo{ext}")
        os.mkfifo(fifo)
        out[fifo] = "FIFO"
        d = os.path.join(tmp, f"dir{ext}")
        os.mkdir(d)
        out[d] = "folder"
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(tmp, f"sock{ext}"))
        s.close()
        out[os.path.join(tmp, f"sock{ext}")] = "socket"
        if os.geteuid() == 0:
            dev = os.path.join(tmp, f"null{ext}")
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            out[dev] = "device"
        link = os.path.join(tmp, f"link{ext}")
        os.symlink(fifo, link)
        out[link] = "link to a FIFO"
    return out


def _modes(paths) -> dict:
    return {p: os.lstat(p).st_mode for p in paths}


# ---------------------------------------------------------------------------------------------- config files
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_attention_heads": 8,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
DEEPSPEED = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "train_batch_size": 64,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
    "bf16": {"enabled": True},
}
HARDWARE = {
    "name": "lab",
    "peak_flops": 312e12,
    "memory_bytes": 80e9,
    "hbm_bandwidth": 2e12,
    "gpus_per_node": 8,
    "nvlink_bandwidth": 300e9,
    "nic_bandwidth": 25e9,
    "alpha_intra": 2e-6,
    "alpha_inter": 5e-6,
    "gemm_efficiency": 0.7,
    "attention_efficiency": 0.6,
}
TOPOLOGY = {
    "name": "lab",
    "alpha": 2e-6,
    "beta": 1e-9,
    "gamma": 1e-10,
    "gpus_per_node": 4,
    "alpha_inter": 5e-6,
    "beta_inter": 4e-8,
}
WORKLOAD = [{"prompt_len": 5, "output_len": 4, "arrival_s": 0.0}, {"prompt_len": 3, "output_len": 2, "arrival_s": 0.1}]
MEGATRON = [
    "--num-layers",
    "4",
    "--hidden-size",
    "512",
    "--num-attention-heads",
    "8",
    "--seq-length",
    "1024",
    "--tensor-model-parallel-size",
    "2",
    "--micro-batch-size",
    "1",
    "--global-batch-size",
    "16",
]

CONFIGS = {  # kind -> (base, the command that reads it, the flag)
    "hf": (LLAMA, ["plan", "estimate", "--gpus", "8", "--tp", "2", "--global-batch", "16"], "--model-config"),
    "deepspeed": (DEEPSPEED, ["plan", "estimate", "--model", "llama-3-8b", "--gpus", "8"], "--deepspeed-config"),
    "hardware": (
        HARDWARE,
        ["plan", "estimate", "--model", "llama-3-8b", "--gpus", "8", "--tp", "8", "--global-batch", "8"],
        "--hardware",
    ),
    "topology": (TOPOLOGY, ["collective", "allreduce", "--world", "8", "--bytes", "1KiB"], "--topology"),
    "workload": (
        WORKLOAD,
        [
            "serve",
            "--context",
            "64",
            "--kv-blocks",
            "16",
            "--block-size",
            "4",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--vocab",
            "32",
        ],
        "--workload",
    ),
}
# JSON texts no numeric or typed field takes (what a file's field must refuse), and texts that may be valid
BAD_JSON = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1",
    "-0.5",
    "true",
    "false",
    '"x"',
    "[]",
    "{}",
    str(2**70),
    '"12"',
    "1e30",
]
EITHER_JSON = ["null", "0", "1", "2.5", "7"]
NOT_NONSENSE = {  # fields where a value from BAD_JSON is still a valid setting
    "tie_word_embeddings": {"true", "false"},
    "model_type": {'"x"', '"12"'},
    "architectures": {"[]"},
    "overlap_comm": {"true", "false"},
    "enabled": {"true", "false"},
    "rope_theta": {"1e30", str(2**70)},
    "name": {'"x"', '"12"'},
}


def _fields(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _fields(v, path + (k,)) if isinstance(v, dict) else [path + (k,)]
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _fields(v, path + (i,))


def _put(obj, path, marker):
    obj = json.loads(json.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = marker
    return obj


def config_cases():
    """Every (kind, field path) a mutation can land on; megatron flags as ('megatron', flag index)."""
    out = [(kind, path) for kind, (base, _, _) in CONFIGS.items() for path in _fields(base)]
    out += [("megatron", (i,)) for i in range(1, len(MEGATRON), 2)]
    return out


def run_config(kind, path, value: str, tmp) -> tuple[str, str]:
    """Run the command reading a config whose field ``path`` holds the JSON text ``value``: (class, detail)."""
    invalid = value in BAD_JSON and value not in NOT_NONSENSE.get(str(path[-1]), ())
    if kind == "megatron":
        words = list(MEGATRON)
        words[path[0]] = value.strip('"')
        argv = ["plan", "estimate", "--gpus", "8", f"--megatron-args={' '.join(words)}"]
        invalid = value in (
            "NaN",
            "Infinity",
            "-Infinity",
            "1e400",
            "-1",
            "-0.5",
            "true",
            "false",
            '"x"',
            "[]",
            "{}",
            str(2**70),
            "1e30",
        )
    else:
        base, argv, flag = CONFIGS[kind]
        marker = "__FUZZ__"
        text = (
            json.dumps(_put(base, path, marker))
            if kind != "workload"
            else "\n".join(json.dumps(_put(WORKLOAD, path, marker)[i]) for i in range(len(WORKLOAD)))
        )
        f = os.path.join(tmp, f"{kind}.json{'l' if kind == 'workload' else ''}")
        with open(f, "w") as fh:
            fh.write(text.replace(f'"{marker}"', value))
        argv = argv + [flag, f]
    state = snapshot()
    code, err, seconds, escaped = run(argv)
    left = leftovers(state)
    if left and code != "unbounded":
        return "leftover", f"{kind} {'.'.join(map(str, path))}={value}: exit {code}, left {left}"
    if kind == "workload" and code == 0 and invalid and "request rejected" in err:
        return "clean", ""  # the bad line was rejected with a reason; the others were served
    if kind == "workload" and code == 2 and "no request could be read" in err:
        return "clean", ""
    cls = classify("plan" if kind != "workload" else "serve", code, err, escaped, invalid)
    return cls, f"{kind} {'.'.join(map(str, path))}={value}: exit {code} {err.strip()[-300:] or escaped!r}"


def run_process(name: str, argv, limit: float = LIMIT):
    """``run`` for :data:`PROCESSES`: ``python -m netmorph argv`` in a process of its own, its temporary folder
    the cases'; a server (:data:`SERVES`) gets SIGINT once it has served its seconds, as Ctrl-C stops it."""
    serve = SERVES.get(name)
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "netmorph", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": scratch_dir()},
        # Ctrl-C's SIGINT reaches it even when the suite runs in the background (`&` ignores it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _, err = p.communicate(timeout=serve or limit)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT if serve else signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            return "unbounded", err, time.monotonic() - t0, None
        if not serve:
            return "unbounded", err, time.monotonic() - t0, None
    return p.returncode, err, time.monotonic() - t0, None


def run_flag(name, flag, action, value: str, tmp, paths) -> tuple[str, str]:
    """One flag case: (class, detail)."""
    base = [a.replace("{port}", str(_free_port())) for a in BASE[name]]
    cut = base.index("--") if "--" in base else len(base)  # launch's own flags before its subcommand
    argv = base[:cut] + ([f"{flag}={value}"] if value.startswith("-") else [flag, value]) + base[cut:]
    before = _modes(paths) if flag in OUTPUTS else {}
    state = snapshot()
    code, err, seconds, escaped = run_process(name, argv) if name in PROCESSES else run(argv)
    if before and _modes(paths) != before:
        return "destroyed", f"{argv}: {before} -> {_modes(paths)}"
    left = leftovers(state)
    if left and code != "unbounded":
        return "leftover", f"{argv}: exit {code}, left {left}"
    numeric = action.type in (exact_int, finite_float, seed_int, timeout_seconds)
    invalid = value in INVALID and (numeric or value in ("", " ")) and flag not in OUTPUTS | INPUTS
    return classify(name, code, err, escaped, invalid), f"{argv}: exit {code} {err.strip()[-300:] or escaped!r}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flag_value(rng: random.Random, flag, action, tmp, paths, files) -> str:
    if flag in OUTPUTS:
        return rng.choice(sorted(paths) + ["/nonexistent/dir/x.png", "/proc/x.json", "/", "", "x" * 300 + ".png"])
    if flag in INPUTS:
        return rng.choice(files)
    if action.dest in IMPLIED and rng.random() < 0.5:
        return rng.choice(IMPLIED[action.dest])
    if action.dest in ("minbytes", "maxbytes", "stepbytes", "bytes", "sizes"):
        return rng.choice(SIZES + MAYBE)
    return rng.choice(INVALID + MAYBE + [rng.choice("abcxyz") * rng.randint(1, 4)])


def switch_cases() -> list:
    """(subcommand, switches): every output switch alone and all of a subcommand's together."""
    out = []
    for name, switches in SWITCHES.items():
        out += [(name, (s,)) for s in switches]
        if len(switches) > 1:
            out.append((name, switches))
    return out


def run_switches(name: str, switches, tmp) -> tuple[str, str]:
    """``BASE[name]`` with output switches: (class, detail) -- "bad output" when a run that exited 0 did not
    give one JSON document on stdout (``--json``), a JSON trace (``--trace``) or a PNG (``--plot``)."""
    argv, files = list(BASE[name]), {}
    for s in switches:
        if s == "--json":
            argv.append(s)
        else:
            files[s] = os.path.join(tmp, f"switch-{name}{s}.{'json' if s == '--trace' else 'png'}")
            if os.path.exists(files[s]):
                os.unlink(files[s])
            argv += [s, files[s]]
    state = snapshot()
    stdout = []
    code, err, seconds, escaped = run(argv, out=stdout)
    detail = f"{argv}: exit {code} {err.strip()[-300:] or escaped!r}"
    left = leftovers(state)
    if left and code != "unbounded":
        return "leftover", f"{detail}, left {left}"
    cls = classify(name, code, err, escaped, False)
    if cls != "clean" or code != 0:
        return cls, detail
    try:
        if "--json" in switches:
            json.loads(stdout[0])
        if "--trace" in files:
            with open(files["--trace"]) as fh:
                json.load(fh)
        if "--plot" in files:
            with open(files["--plot"], "rb") as fh:
                if fh.read(8) != b"\x89PNG\r\n\x1a\n":
                    raise ValueError("not a PNG")
    except (ValueError, OSError) as e:
        return "bad output", f"{detail}: {type(e).__name__}: {e}"
    return "clean", detail


def bad_files(tmp) -> list:
    out = []
    for stem, data in {
        "list": b"[1, 2]",
        "binary": b"\xff\xfe\x00",
        "deep": b"[" * 50000,
        "nan": b'{"alpha": NaN, "beta": 1}',
        "strings": b'{"alpha": "x", "beta": "y"}',
        "empty": b"",
        "negative": b'{"alpha": -1, "beta": -1e-9, "gpus_per_node": -8}',
    }.items():
        p = os.path.join(tmp, f"{stem}.json")
        with open(p, "wb") as fh:
            fh.write(data)
        out.append(p)
    return out + ["/dev/zero", "/nonexistent.json", tmp]


# ---------------------------------------------------------------------------------------------- ranks
def _mismatched(comm, case: int):
    import numpy as np

    r, p = comm.rank, comm.world
    x = np.ones(8, np.float32)
    if case == 0:
        comm.broadcast(x, src=r)  # each its own root
    elif case == 1:
        comm.all_reduce(np.ones(8 + (r == p - 1), np.float32), algo="ring")  # one count differs
    elif case == 2:
        comm.all_reduce(x, op="max" if r else "sum")
    elif case == 3:
        comm.all_reduce(x.astype(np.float64) if r == 0 else x)
    elif case == 4:
        comm.all_reduce(x, algo="ring" if r else "recursive_doubling")
    elif case == 5:
        if r == 0:
            comm.all_reduce(x)  # one rank calls one collective more
        comm.all_gather_into_tensor(np.ones(8 * p, np.float32), x)
    elif case == 6:
        comm.reduce(x, dst=r % 2)
    elif case == 7:
        comm.all_reduce(x, op="avg" if r else "sum")
    elif case == 8:  # each sends to the next, none receives
        comm.send(np.ones(1 << 20, np.float32), (r + 1) % p)
    return 0


MISMATCHES = 9


def run_mismatch(case: int, world: int, backend: str, timeout: float = 2.0) -> tuple[str, str]:
    """A program whose ranks disagree: 'clean' when it fails with a named mismatch or deadlock."""
    from netmorph.runtime.launch import LaunchError, launch

    try:
        launch(_mismatched, world, case, timeout=timeout, backend=backend)
    except LaunchError as e:
        kinds = {f.exc_type for f in e.failures}
        if e.root.exc_type in ("CollectiveMismatch", "Deadlock") and "Traceback" not in e.root.message:
            return "clean", ""
        return "silent", f"mismatch {case} world {world} {backend}: {str(e).splitlines()[0]} {kinds}"
    return "silent", f"mismatch {case} world {world} {backend}: no error"


def run_blame(rng: random.Random) -> tuple[str, str]:
    """A rank SIGSTOPped at a random call in a random layout: 'clean' when the error names it first."""
    from netmorph.mesh.shape import ModelShape
    from netmorph.parallel.config import TrainConfig
    from netmorph.parallel.hybrid import train_rank
    from netmorph.runtime import Fault
    from netmorph.runtime.launch import LaunchError, launch

    tp, pp, dp = rng.choice([(2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 4, 1), (4, 1, 1), (1, 1, 4), (2, 2, 2)])
    cfg = TrainConfig.make(
        model=ModelShape(layers=4, hidden=16, heads=4, seq=8, vocab=32),
        tp=tp,
        pp=pp,
        dp=dp,
        steps=3,
        dtype="float32",
        microbatches=4,
    )
    cfg.check()
    victim, at = rng.randrange(cfg.world), rng.randint(2, 20)
    t0 = time.monotonic()
    try:
        # 4 s without progress before a rank gives up: on two loaded cores a running rank can go 2 s without
        # reaching its next call before the victim has stopped, and then naming the running rank is right
        launch(train_rank, cfg.world, cfg, None, faults=[Fault("stop", rank=victim, at_op=at)], timeout=4.0)
    except LaunchError as e:
        took = time.monotonic() - t0
        if e.root.rank == victim and "SIGSTOP" in e.root.describe():
            return "clean", f"{took:.1f} s"
        return "wrong blame", f"tp{tp} pp{pp} dp{dp} victim {victim} at op {at}: {str(e).splitlines()[0]}"
    return "clean", "the run ended before the stop"
