"""Sizes and times in real units.

Sizes follow nccl-tests and the SI/IEC split: a bare ``K/M/G`` is binary as in
nccl-tests (``-e 128M`` = 128·2^20 B), ``KiB/MiB/GiB`` binary, ``KB/MB/GB`` decimal
(10^3, 10^6, 10^9). Bandwidths are decimal GB/s, as
nccl-tests prints them.
"""

from __future__ import annotations

import re

import numpy as np

from netmorph.errors import UsageError

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "M": 1024**2,
    "G": 1024**3,
    "T": 1024**4,  # nccl-tests' -b 8 -e 128M: binary
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}
# element types by nccl-tests' names and numpy's: name -> (numpy name, bytes per element).
# bfloat16 is ml_dtypes' numpy type (numpy has none of its own): see numpy_dtype.
DTYPES = {
    "float": ("float32", 4),
    "float32": ("float32", 4),
    "half": ("float16", 2),
    "float16": ("float16", 2),
    "bfloat16": ("bfloat16", 2),
    "double": ("float64", 8),
    "float64": ("float64", 8),
    "int32": ("int32", 4),
    "int64": ("int64", 8),
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
}
MAX_SIZE = 1 << 50  # 1 PiB: past it counts overflow int64 element arithmetic
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, argument: str = "nbytes") -> int:
    """``"8MiB"`` -> 8388608; ``"1.5GB"`` -> 1500000000. Raises UsageError naming ``argument``."""
    m = _SIZE.match(str(text))
    if not m:
        raise UsageError(f"{{{argument}}}: cannot parse size {text!r} (use e.g. 1024, 64KiB, 8MiB, 1GB)", argument)
    value, unit = float(m.group(1)), m.group(2).upper()
    if unit not in _UNITS:
        raise UsageError(
            f"{{{argument}}}: unknown unit {m.group(2)!r} in {text!r} (use B, K, M, G (binary), KiB, MiB, GiB, or KB, MB, GB (decimal))",
            argument,
        )
    nbytes = value * _UNITS[unit]
    if nbytes > MAX_SIZE:
        raise UsageError(f"{{{argument}}}: {text!r} is more than 1 PiB", argument)
    if nbytes != int(nbytes):
        raise UsageError(f"{{{argument}}}: {text!r} is not a whole number of bytes", argument)
    return int(nbytes)


_NCCL_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(\S?)")
_NCCL_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_nccl_size(text: str, argument: str = "nbytes") -> int:
    """A size as nccl-tests' ``parsesize`` reads it: a number, then only the first letter after it counts --
    K, M or G, binary, either case (``1K`` = ``1KB`` = ``1KiB`` = 1024; ``128M`` = 134,217,728) -- and the
    bytes are truncated to a whole number. Any other letter is an invalid size there, and here."""
    m = _NCCL_SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _NCCL_UNITS:
        raise UsageError(
            f"{{{argument}}}: cannot read {text!r} as nccl-tests does: a number of bytes, or with K, M "
            f"or G (binary: 1K = 1024)",
            argument,
        )
    nbytes = float(m.group(1)) * _NCCL_UNITS[unit]
    if nbytes > MAX_SIZE:
        raise UsageError(f"{{{argument}}}: {text!r} is more than 1 PiB", argument)
    return int(nbytes)


def parse_size_range(text: str, argument: str = "sizes") -> list[int]:
    """``"1KiB:1MiB"`` -> every power-of-two multiple from 1 KiB to 1 MiB (nccl-tests ``-f 2``)."""
    if ":" not in str(text):
        raise UsageError(f"{{{argument}}}: expected MIN:MAX, e.g. 1KiB:64MiB, got {text!r}", argument)
    lo_s, hi_s = str(text).split(":", 1)
    lo, hi = parse_size(lo_s, argument), parse_size(hi_s, argument)
    if lo <= 0 or hi < lo:
        raise UsageError(f"{{{argument}}}: need 0 < MIN <= MAX, got {text!r}", argument)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return sizes


# nccl-tests' -d names (src/common.cu: test_typenames) -> numpy's, for every type both have
NCCL_TYPES = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bfloat16": "bfloat16",
}


def numpy_dtype(name) -> np.dtype:
    """The numpy dtype of a type name: numpy's own, or ``bfloat16`` from ml_dtypes (the type JAX and
    TensorFlow hand numpy), whose arithmetic is float32's rounded once to bfloat16, as NCCL's adds."""
    if str(name) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def parse_dtype(name: str, argument: str = "dtype") -> tuple[str, int]:
    """``"float"`` -> ``("float32", 4)`` (nccl-tests' ``-d`` names and numpy's)."""
    if name not in DTYPES:
        raise UsageError(f"{{{argument}}}: unknown type {name!r}; choose one of {', '.join(DTYPES)}", argument)
    return DTYPES[name]


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*$")
_SECONDS = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600, "d": 86400, "day": 86400, "days": 86400}


def parse_duration(text: str, argument: str = "duration") -> float:
    """``"3.1h"`` -> 11160.0 s; ``"1min"``, ``"30s"``, ``"2d"``. The unit is required (a bare number is
    ambiguous between seconds and hours, the two units these flags are quoted in) -- except for 0."""
    if str(text).strip() in ("0", "0.0"):  # no time needs no unit
        return 0.0
    m = _DURATION.match(str(text))
    if not m or m.group(2).lower() not in _SECONDS:
        raise UsageError(
            f"{{{argument}}}: cannot parse duration {text!r} (use a number and a unit: 30s, 10min, 3.1h, 2d)", argument
        )
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def fmt_bytes(n: float) -> str:
    """Human size with a binary unit (exact powers print without decimals)."""
    n = float(n)
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_params(n: float) -> str:
    """A parameter count as papers print it (``174.62 x 1e9``); under 1e8 (netmorph's own models) whole."""
    return f"{n / 1e9:,.2f} x 1e9" if n >= 1e8 else f"{n:,.0f}"


def fmt_memory(n: float) -> str:
    """``5.6 GB (5.3 GiB)``; under 0.1 GB, where that would read 0.0 GB, in binary units (``2.43 MiB``)."""
    return f"{n / 1e9:.1f} GB ({n / 2**30:.1f} GiB)" if n >= 1e8 else fmt_bytes(n)


def fmt_time(seconds: float) -> str:
    """Seconds with a unit a reader can compare at a glance."""
    s = float(seconds)
    if s == 0:
        return "0 s"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.2f} us"
    if abs(s) < 1:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"
