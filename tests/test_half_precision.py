"""bfloat16 and float16 on the local fabric: every collective on torch's half types, reduced as NCCL reduces
them (each hop adds in float32 and rounds once to the type), equal to torch.distributed/gloo's result on the
same inputs wherever the order of additions cannot matter: two ranks (one addition), or sums the type holds
exactly. (bfloat16 used to be refused on the local fabric: numpy has no such type.)"""

import numpy as np
import pytest
import torch

from netmorph.runtime.launch import launch

pytestmark = pytest.mark.timeout(120)


def _every_collective(comm, dtype: str, exact: bool):
    dt = getattr(torch, dtype)
    p, me = comm.world, comm.rank
    g = torch.Generator().manual_seed(1000 + me)

    def data(n):
        if exact:  # small integers: every partial sum is exact in the type
            return torch.randint(-8, 9, (n,), generator=g).to(dt)
        return (torch.randn(n, generator=g) * 3).to(dt)

    n = 6 * p
    out = {}
    x = data(n)
    comm.all_reduce(x)
    out["all_reduce"] = x
    x = data(n)
    comm.all_reduce(x, op="max")
    out["all_reduce max"] = x
    x = data(n)
    comm.reduce(x, 1)
    out["reduce"] = x if me == 1 else torch.zeros(n, dtype=dt)
    x = data(n)
    comm.broadcast(x, 1)
    out["broadcast"] = x
    x = data(n // p)
    y = torch.empty(n, dtype=dt)
    comm.all_gather_into_tensor(y, x)
    out["all_gather"] = y
    x = data(n)
    y = torch.empty(n // p, dtype=dt)
    comm.reduce_scatter_tensor(y, x)
    out["reduce_scatter"] = y
    x = data(n)
    y = torch.empty(n, dtype=dt)
    comm.all_to_all_single(y, x)
    out["all_to_all"] = y
    assert all(v.dtype == dt for v in out.values())
    return {k: v.float().tolist() for k, v in out.items()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("world, exact", [(2, False), (4, True)])
def test_local_fabric_equals_gloo_on_half_types(dtype, world, exact):
    local = launch(_every_collective, world, dtype, exact, timeout=30)
    gloo = launch(_every_collective, world, dtype, exact, backend="torch-native", timeout=30, fingerprints=False)
    for r in range(world):
        for name in local[r]:
            assert local[r][name] == gloo[r][name], (dtype, world, r, name)


def _two_ranks_sum(comm, dtype):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(7 + comm.rank)
    x = torch.randn(4096, generator=g).to(dt)
    mine = x.clone()
    comm.all_reduce(x, algo="ring")
    return mine.float().numpy(), x.float().numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_each_hop_adds_in_float32_and_rounds_once(dtype):
    (a, got), (b, _) = launch(_two_ranks_sum, 2, dtype, timeout=30)
    want = (torch.tensor(a) + torch.tensor(b)).to(getattr(torch, dtype)).float().numpy()  # f32 add, one rounding
    assert np.array_equal(got, want)
    # and not the float32 sum: the wire carries the half type, as NCCL's does
    assert not np.array_equal(got, a + b)


def _numpy_bfloat16(comm):
    from netmorph.units import numpy_dtype

    x = np.full(8, 1.5, dtype=numpy_dtype("bfloat16"))
    comm.all_reduce(x, op="avg")
    return x.astype(np.float32).tolist()


def test_ml_dtypes_bfloat16_arrays_travel_as_they_are():
    assert launch(_numpy_bfloat16, 3, timeout=30) == [[1.5] * 8] * 3
