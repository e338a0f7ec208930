import pytest

from netmorph.collectives import bandwidths
from netmorph.errors import UsageError
from netmorph.units import parse_size, parse_size_range


@pytest.mark.parametrize(
    "text,want",
    [
        ("8MiB", 8 << 20),
        ("1GB", 10**9),
        ("1.5KB", 1500),
        ("4096", 4096),
        ("64 KiB", 65536),
        ("2gib", 2 << 30),
        ("0", 0),
        ("1e3", 1000),
    ],
)
def test_parse(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["-1KiB", "abc", "1.5B", "8XB", ""])
def test_parse_rejects(text):
    with pytest.raises(UsageError, match="^nbytes: ") as e:
        parse_size(text)
    assert e.value.argument == "nbytes" and e.value.render({"nbytes": "--bytes"}).startswith("--bytes: ")


def test_range():
    assert parse_size_range("1KiB:8KiB") == [1024, 2048, 4096, 8192]
    with pytest.raises(UsageError, match="^sizes: need 0 < MIN <= MAX"):
        parse_size_range("8KiB:1KiB")


def test_nccl_tests_bus_bandwidth():
    algbw, busbw = bandwidths("allreduce", 1 << 30, 8e-3, 8)
    assert round(algbw, 3) == 134.218 and round(busbw, 3) == 234.881
    assert bandwidths("allgather", 1 << 30, 8e-3, 8)[1] == pytest.approx(algbw * 7 / 8)
    assert bandwidths("broadcast", 1 << 30, 8e-3, 8)[1] == pytest.approx(algbw)


def test_parameter_counts_and_memory_read_at_the_models_scale():
    """A published model prints as papers do; netmorph's own models (a local profile's) whole, not as 0.00."""
    from netmorph.units import fmt_memory, fmt_params

    assert fmt_params(174.62e9) == "174.62 x 1e9" and fmt_params(210_304) == "210,304"
    assert fmt_memory(5.6e9) == "5.6 GB (5.2 GiB)" and fmt_memory(2.5 * 2**20) == "2.50 MiB"
