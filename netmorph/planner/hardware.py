"""Accelerators and the clusters they come in, for the planner.

Each preset gives peak dense 16-bit (and, where the tensor cores have it, FP8) FLOP/s, memory,
HBM bandwidth, and the
two-level network the collectives are timed on (:class:`netmorph.cost.topology.Topology`),
plus the planner's two efficiency knobs, both documented and overridable
(``--efficiency``, or a JSON file):

- ``gemm_efficiency``: the fraction of peak that a transformer's 16-bit matmuls reach. It is
  fitted once, on the calibration set's A100 runs (0.71, :data:`CALIBRATED_EFFICIENCY`), and carried to
  other parts by their measured matmul ceiling: each preset's value is 0.71 x (its MAMF / its peak) / (A100's
  MAMF / A100's peak), where MAMF is the maximum achievable matmul FLOP/s measured over a
  sweep of shapes (Bekman, *Machine Learning Engineering*, "Maximum Achievable Matmul FLOPS
  comparison table": A100 SXM 271.2 of 312 TFLOP/s, H100 SXM 794.5 of 989 -- "H200 is the
  same"). An H100 is not a faster A100: its tensor cores hold a smaller share of their
  datasheet peak (power and clock limits), 0.66 against 0.71. V100 has no published MAMF and
  keeps the calibrated value;
- ``fp8_gemm_efficiency``: the same for FP8 GEMMs, from the FP8 MAMF (H100 SXM 1402.6, H200
  SXM 1453.4 of 1979 TFLOP/s): 0.57 and 0.59 of the FP8 peak;
- ``attention_efficiency``: the fraction of the 16-bit peak a fused FlashAttention kernel
  reaches on the attention core (QKᵀ, softmax, ·V), forward and backward together: about
  0.6 on A100 and V100-class parts (FlashAttention-2, Dao 2023: 50-73% forward, lower
  backward, on A100) and 0.35 on H100/H200 (FlashAttention-3, Shah et al. 2024: "FlashAttention-2
  achieves only 35% utilization on H100"); the unfused (standard) attention of the 2021-22
  papers runs as batched GEMMs at ``gemm_efficiency``;
- ``gemm_table`` / ``fp8_gemm_table`` (optional, from a hardware JSON file): matmul
  efficiency by GEMM size, bins of GFLOP per GEMM with their measured efficiency, as
  ``python benchmarks/gemm_efficiency.py`` prints them on the GPU (Calculon's approach:
  small GEMMs run further from peak). The presets carry none yet -- they need a GPU to
  measure -- so every GEMM runs at ``gemm_efficiency`` (``fp8_gemm_efficiency``);
- ``elementwise_passes``: how many times the bytes of a layer's stored activations
  (Korthikanti et al.'s per-layer activation bytes) cross HBM in the non-matmul
  kernels of one forward+backward (layernorm, dropout, softmax, GeLU, residual adds).
  This memory-bound work is why small hidden sizes reach a lower share of peak. Fitted with the
  matmul efficiency on the calibration set (8, :data:`CALIBRATED_PASSES`).

Sources: NVIDIA V100, A100 (40 GB and 80 GB), H100 SXM and H200 SXM datasheets (peak dense
FLOP/s without sparsity, memory, HBM bandwidth); DGX-2, DGX A100, DGX H100 and DGX H200
system guides (NVSwitch bandwidth per GPU, one 200 Gb/s HDR or 400 Gb/s NDR NIC per GPU).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from netmorph.cost.topology import Topology
from netmorph.errors import UsageError
from netmorph.files import path_exists, read_json_object

# The two constants fitted on the calibration set (Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022), jointly
# on a grid by ``python scripts/validate_planner.py`` (its calibration fit: the point whose worse source is best;
# its --check fails when these are not that point): the A100's 16-bit matmul efficiency and the elementwise passes
CALIBRATED_EFFICIENCY = 0.71
CALIBRATED_PASSES = 8.0


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense fp16/bf16 tensor FLOP/s per device
    memory_bytes: float
    hbm_bandwidth: float  # B/s
    gpus_per_node: int
    nvlink_bandwidth: float  # B/s each way per device
    nic_bandwidth: float  # B/s each way per device (its own InfiniBand NIC)
    alpha_intra: float = 2e-6
    alpha_inter: float = 5e-6
    collective_base_s: float = 0.0  # what a collective costs once, beside α per step (NCCL's tuner prices a call as
    # baseLat + steps x hwLat, src/graph/tuning.cc); 0 in the presets, fitted by
    # netmorph calibrate from ring all-reduces of several group sizes
    gemm_efficiency: float = CALIBRATED_EFFICIENCY
    elementwise_passes: float = CALIBRATED_PASSES
    description: str = ""
    fp8_flops: float = 0.0  # dense FP8 tensor FLOP/s (0: no FP8 tensor cores)
    attention_efficiency: float = 0.6  # a FlashAttention kernel's share of the 16-bit peak
    gemm_table: tuple = ()  # ((GFLOP upper bound, efficiency), ...) measured; () = gemm_efficiency
    fp8_gemm_table: tuple = ()  # the same for FP8 GEMMs
    fp8_gemm_efficiency: float = 0.0  # FP8 GEMMs' share of fp8_flops (0: gemm_efficiency)
    op_overhead_s: float = 0.0  # what one operator costs whatever its size: a kernel launch, eager dispatch
    pipeline_hop_s: float = 0.0  # what a pipeline send costs beyond the link's α and β: its receiver waited asleep
    # and, where ranks share cores, waits for one (0: a GPU's stream; measured by
    # netmorph calibrate's relay)
    overlap: float = 1.0  # the share of a collective that can hide behind compute (1: a GPU's own
    # stream and SMs; measured by netmorph calibrate where ranks share cores)
    allreduce_algorithms: tuple = ()  # what an all-reduce may run (NCCL_ALGO): () the cheaper per size of
    # ring and double binary tree, as NCCL's tuner picks; ("ring",) where
    # the ranks' library runs rings only (netmorph's trainer)
    optimizer_bandwidth: float = 0.0  # B/s the optimizer step streams its state at (0: hbm_bandwidth, a fused
    # Adam's one pass; measured by netmorph calibrate on the trainer's Adam)
    core_sharing: float = 1.0  # how many times slower a rank computes while every rank of its node does
    # than alone (1: a device per rank; measured where ranks share cores)
    comm_slowdown: float = 0.0  # how much slower compute runs while a collective runs beside it (NCCL's kernels
    # take SMs and HBM bandwidth); 0: not at all (a rank's collectives on a thread
    # of their own, as netmorph's local fabric runs them)
    multi_rail: bool = True  # a group's rings leave a node on as many NICs as it has members there (NCCL's
    # channels, one per NIC); False: one ring over one link (netmorph's own rings)
    compute_scale: float = 1.0  # a real layer's measured compute over what the fields above predict for it
    # (1: a device per rank; measured by netmorph calibrate on a reference
    # layer where ranks share cores and caches)

    @property
    def fp8_efficiency(self) -> float:
        return self.fp8_gemm_efficiency or self.gemm_efficiency

    def topology(self) -> Topology:
        return Topology(
            self.name,
            alpha=self.alpha_intra,
            beta=1 / self.nvlink_bandwidth,
            gamma=3 / self.hbm_bandwidth,
            gpus_per_node=self.gpus_per_node,
            alpha_inter=self.alpha_inter,
            beta_inter=1 / self.nic_bandwidth,
            node_bandwidth=self.nic_bandwidth * self.gpus_per_node,
        )


GiB = 1024**3
PROFILE_FORMAT = "netmorph-profile/1"  # the "format" of a file netmorph calibrate writes
# maximum achievable matmul FLOP/s, measured (Bekman, Machine Learning Engineering, MAMF table; mean of 100
# iterations per shape): (16-bit MAMF, 16-bit peak, FP8 MAMF, FP8 peak)
MAMF = {
    "a100": (271.2e12, 312e12, 0.0, 0.0),
    "h100": (794.5e12, 989e12, 1402.6e12, 1979e12),
    "h200": (794.5e12, 989e12, 1453.4e12, 1979e12),
}


def carried_efficiency(part: str, fp8: bool = False) -> float:
    """The calibrated A100 matmul efficiency carried to ``part`` by the ratio of their measured ceilings."""
    a100 = MAMF["a100"][0] / MAMF["a100"][1]
    mamf, peak, mamf8, peak8 = MAMF[part]
    return round(CALIBRATED_EFFICIENCY * ((mamf8 / peak8) if fp8 else (mamf / peak)) / a100, 4)


# a GEMM's slowdown while a collective runs beside it on the same GPU: 18.9% on average over GPT and Llama
# layers on 4 A100s, H100s, MI250s and MI210s (Lee et al. 2025, "Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114; at most 40%) -- the GPU presets' default, until
# `netmorph calibrate` measures it on the hardware at hand (a sourced figure, not fitted on any run here)
OVERLAP_SLOWDOWN = 0.189

PRESETS = {
    h.name: replace(h, comm_slowdown=OVERLAP_SLOWDOWN)
    for h in [
        Hardware(
            "v100-32g",
            125e12,
            32 * GiB,
            900e9,
            16,
            150e9,
            12.5e9,
            gemm_efficiency=CALIBRATED_EFFICIENCY,
            description="DGX-2: 16 V100-32GB on NVSwitch (300 GB/s bidirectional per GPU), 8 x 100 Gb/s EDR per node",
        ),
        Hardware(
            "a100-40g",
            312e12,
            40 * GiB,
            1555e9,
            8,
            300e9,
            25e9,
            gemm_efficiency=carried_efficiency("a100"),
            description="DGX A100 (320 GB): 8 A100-40GB SXM, NVLink 3 600 GB/s bidirectional, 8 x 200 Gb/s HDR "
            "per node",
        ),
        Hardware(
            "a100-80g",
            312e12,
            80 * GiB,
            2039e9,
            8,
            300e9,
            25e9,
            gemm_efficiency=carried_efficiency("a100"),
            description="DGX A100 (Selene): 8 A100-80GB, NVLink 3 600 GB/s bidirectional, 8 x 200 Gb/s HDR per node",
        ),
        Hardware(
            "h100-80g",
            989e12,
            80 * GiB,
            3350e9,
            8,
            450e9,
            50e9,
            gemm_efficiency=carried_efficiency("h100"),
            fp8_flops=1979e12,
            fp8_gemm_efficiency=carried_efficiency("h100", fp8=True),
            attention_efficiency=0.35,
            description="DGX H100: 8 H100-80GB SXM, NVLink 4 900 GB/s bidirectional, 8 x 400 Gb/s NDR per node",
        ),
        Hardware(
            "h200",
            989e12,
            141e9,
            4800e9,
            8,
            450e9,
            50e9,
            gemm_efficiency=carried_efficiency("h200"),
            fp8_flops=1979e12,
            fp8_gemm_efficiency=carried_efficiency("h200", fp8=True),
            attention_efficiency=0.35,
            description="DGX H200: 8 H200-141GB SXM (HBM3e 4.8 TB/s), NVLink 4 900 GB/s bidirectional, "
            "8 x 400 Gb/s NDR per node",
        ),
    ]
}


def hardware_from(data: dict, where: str) -> Hardware:
    """A :class:`Hardware` from a hardware file's object or a ``netmorph calibrate`` profile (its measured
    ``hardware`` fields), every field checked; UsageError naming the first that is wrong (``where``: whence)."""
    if data.get("format") == PROFILE_FORMAT:  # netmorph calibrate's profile: its measured fields
        name = data.get("name")
        data = data.get("hardware")
        if not isinstance(data, dict):
            raise UsageError(f"{{hardware}}: {where}: a profile's hardware must be an object", "hardware")
        if name is not None:
            data.setdefault("name", name)
    data = dict(data)
    for key in ("gemm_table", "fp8_gemm_table"):
        if key in data:
            data[key] = _table(data[key], key, where)
    if "allreduce_algorithms" in data:
        data["allreduce_algorithms"] = _algorithms(data["allreduce_algorithms"], where)
    try:
        hw = Hardware(**data)
    except TypeError as e:
        raise UsageError(
            f"{{hardware}}: cannot use {where}: {e}; fields: {', '.join(asdict(PRESETS['a100-80g']))}", "hardware"
        ) from None
    _check_fields(hw, where)
    return hw


def load_hardware(name_or_file: str, efficiency: float | None = None) -> Hardware:
    if name_or_file in PRESETS:
        hw = PRESETS[name_or_file]
    else:
        path = Path(name_or_file)
        if not path_exists(path):
            raise UsageError(
                f"{{hardware}}: {name_or_file!r} is neither a preset ({', '.join(PRESETS)}) nor a file", "hardware"
            )
        data = read_json_object(path, "hardware")
        data.setdefault("name", path.stem)
        hw = hardware_from(data, name_or_file)
    if efficiency is not None:
        if not 0 < efficiency <= 1:
            raise UsageError(f"{{efficiency}} must be in (0, 1], got {efficiency}", "efficiency")
        # the FP8 GEMMs keep their measured ratio to the 16-bit ones
        fp8 = hw.fp8_gemm_efficiency * efficiency / hw.gemm_efficiency if hw.fp8_gemm_efficiency else 0.0
        hw = replace(hw, gemm_efficiency=efficiency, fp8_gemm_efficiency=min(fp8, 1.0))
    return hw


# what a hardware file's numbers must be: (fields, test, the words for it)
_RULES = (
    (("peak_flops", "fp8_flops"), lambda v: 0 <= v <= 1e18, "a number in 0..1e18 FLOP/s (an exaflop per device)"),
    (
        ("peak_flops", "memory_bytes", "hbm_bandwidth", "nvlink_bandwidth", "nic_bandwidth"),
        lambda v: v > 0,
        "a number > 0",
    ),
    (
        ("memory_bytes", "hbm_bandwidth", "nvlink_bandwidth", "nic_bandwidth"),
        lambda v: v <= 1e15,
        "at most 1e15 (a petabyte, or a petabyte per second)",
    ),
    (
        ("alpha_intra", "alpha_inter", "collective_base_s", "op_overhead_s", "pipeline_hop_s"),
        lambda v: 0 <= v <= 1,
        "a number of seconds in 0..1",
    ),
    (("elementwise_passes",), lambda v: 0 <= v <= 1e3, "a number in 0..1000"),
    (("gemm_efficiency", "attention_efficiency"), lambda v: 0 < v <= 1, "a number in (0, 1]"),
    (("overlap",), lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    (("comm_slowdown",), lambda v: 0 <= v <= 10, "a number in [0, 10] (0: compute unslowed beside a collective)"),
    (("compute_scale",), lambda v: 0 < v <= 100, "a number in (0, 100]"),
    (("core_sharing",), lambda v: 1 <= v <= 1e4, "a number in 1..10000 (1: a device per rank)"),
    (("optimizer_bandwidth",), lambda v: 0 <= v <= 1e15, "a number of B/s in 0..1e15 (0: hbm_bandwidth)"),
    (("fp8_gemm_efficiency",), lambda v: 0 <= v <= 1, "a number in [0, 1] (0: as gemm_efficiency)"),
)


def _check_fields(hw: Hardware, where: str) -> None:
    """UsageError naming the first field of a hardware file that is not what the planner divides by or scales
    with (a zero efficiency was a ZeroDivisionError, an efficiency over 1 an MFU over 100%)."""
    for keys, ok, what in _RULES:
        for k in keys:
            v = getattr(hw, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise UsageError(f"{{hardware}}: {where}: {k} must be {what}, got {v!r}", "hardware")
    g = hw.gpus_per_node
    if isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= 1 << 20:
        raise UsageError(f"{{hardware}}: {where}: gpus_per_node must be a whole number >= 1, got {g!r}", "hardware")
    for k in ("name", "description"):
        if not isinstance(getattr(hw, k), str):
            raise UsageError(f"{{hardware}}: {where}: {k} must be a string, got {getattr(hw, k)!r}", "hardware")


def _algorithms(names, where: str) -> tuple:
    """A JSON list of all-reduce algorithm names (any the registry holds) as a tuple; UsageError for an
    unknown one."""
    from netmorph.collectives import REGISTRY

    known = REGISTRY["allreduce"]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n in known for n in names):
        raise UsageError(
            f"{{hardware}}: {where}: allreduce_algorithms must be a list of "
            f"{', '.join(known)} ([]: the cheaper per size), got {names!r}",
            "hardware",
        )
    return tuple(names)


def _table(rows, key: str, where: str) -> tuple:
    """A JSON [[GFLOP upper bound, efficiency], ...] as an ascending tuple ([]: none, the field's default, as a
    preset dumped to a file has it); UsageError for anything else."""
    if isinstance(rows, (list, tuple)) and not rows:
        return ()
    try:
        out = tuple((float(b), float(e)) for b, e in rows)
    except (TypeError, ValueError):
        raise UsageError(
            f"{{hardware}}: {where}: {key} must be a list of [GFLOP upper bound, efficiency] pairs", "hardware"
        ) from None
    if any(not 0 < e <= 1 or b <= 0 for b, e in out) or list(out) != sorted(out):
        raise UsageError(
            f"{{hardware}}: {where}: {key} needs ascending bounds > 0 and efficiencies in (0, 1]", "hardware"
        )
    return out


# -- fields measured on the hardware itself ---------------------------------------------------------------------
# scripts/device_check.py measures a lent GPU (`netmorph calibrate` under torchrun against the preset's datasheet
# peaks) and writes what it measured here, with the date, the device and the command; those fields replace the
# sourced or carried ones of that preset, and its description says so
MEASURED_FILE = Path(__file__).with_name("measured.json")
MEASURED_FORMAT = "netmorph-measured/1"
MEASURED_FIELDS = (
    "gemm_table",
    "fp8_gemm_table",
    "attention_efficiency",
    "comm_slowdown",
    "alpha_intra",
    "nvlink_bandwidth",
    "collective_base_s",
)
SOURCE_KEYS = ("date", "device", "command")


def with_measured(presets: dict, data: dict, where: str) -> dict:
    """``presets`` with each entry of a measured-fields object (:data:`MEASURED_FORMAT`: {"presets": {name:
    {"fields": {...}, "source": {"date", "device", "command", ...}}}}) laid over its preset, every field checked
    as a hardware file's; UsageError naming what is wrong."""
    if data.get("format") != MEASURED_FORMAT or not isinstance(data.get("presets"), dict):
        raise UsageError(f"{{hardware}}: {where}: not a {MEASURED_FORMAT} object with presets", "hardware")
    out = dict(presets)
    for name, entry in data["presets"].items():
        fields, source = (entry.get("fields"), entry.get("source")) if isinstance(entry, dict) else (None, None)
        if name not in presets or not isinstance(fields, dict) or not isinstance(source, dict):
            raise UsageError(
                f"{{hardware}}: {where}: {name!r} must be a preset ({', '.join(presets)}) with fields "
                "and source objects",
                "hardware",
            )
        extra = sorted(set(fields) - set(MEASURED_FIELDS))
        missing = [k for k in SOURCE_KEYS if not isinstance(source.get(k), str)]
        if extra or missing:
            raise UsageError(
                f"{{hardware}}: {where}: {name}: "
                + (
                    f"{', '.join(extra)} not measured here (only {', '.join(MEASURED_FIELDS)})"
                    if extra
                    else f"source lacks {', '.join(missing)}"
                ),
                "hardware",
            )
        base = presets[name]
        note = f"; measured on {source['device']} {source['date']}: {', '.join(sorted(fields))} ({source['command']})"
        sourced = {k: v for k, v in asdict(base).items() if v != ()}  # no table: absent, as in a file
        out[name] = hardware_from({**sourced, **fields, "description": base.description + note}, f"{where} ({name})")
    return out


if path_exists(MEASURED_FILE):
    PRESETS = with_measured(PRESETS, read_json_object(MEASURED_FILE, "hardware"), str(MEASURED_FILE.name))
