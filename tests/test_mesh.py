import pytest

from netmorph.errors import UsageError
from netmorph.mesh import Mesh


def test_megatron_documented_groups():
    m = Mesh(16, tp=2, pp=4)
    assert str(m) == "TP(2)-PP(4)-DP(2)"
    assert m.groups("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert m.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert m.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert m.coords(3) == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 0}
    assert m.describe(3) == "TP(2)-PP(4)-DP(2)-Rank(3)"
    assert m.group("dp", 5) == [5, 7]


def test_every_rank_in_exactly_one_group_per_dim():
    m = Mesh(48, tp=2, pp=3, cp=2)
    for d in ("tp", "cp", "ep", "dp", "pp"):
        flat = sorted(r for g in m.groups(d) for r in g)
        assert flat == list(range(48))
        assert all(len(g) == m.size(d) for g in m.groups(d))


def test_other_order():
    m = Mesh(8, tp=2, pp=2, order="tp-cp-ep-pp-dp")
    assert m.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert m.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(
    "kw,arg,text",
    [
        ({"world": 15, "tp": 2}, "world", "world 15 is not divisible by tp*cp*ep*pp = 2; change world or tp/pp/cp/ep"),
        ({"world": 16, "tp": 2, "dp": 3}, "world", "world 16 != tp*cp*ep*dp*pp"),
        ({"world": 8, "tp": 0}, "tp", "tp must be >= 1, got 0"),
        ({"world": 8, "order": "tp-dp"}, "order", "order must name each of"),
    ],
)
def test_bad_factorisation_names_the_argument(kw, arg, text):
    """The library names its parameter; the CLI spells the same error with its flags."""
    with pytest.raises(UsageError) as e:
        Mesh(**kw)
    assert e.value.argument == arg and str(e.value).startswith(text)
    assert e.value.render({}).startswith(f"--{arg}")
    if arg == "world" and "divisible" in text:
        assert e.value.render({}).endswith("change --world or --tp/--pp/--cp/--ep")


def _device_mesh(comm):
    import numpy as np

    from netmorph.mesh import DeviceMesh

    dm = DeviceMesh(comm, tp=2, pp=2)
    x = np.array([float(comm.rank)])
    comm.all_reduce(x, group=dm["tp"])
    y = np.array([float(comm.rank)])
    comm.all_reduce(y, group=dm.get_group("dp"))
    z = np.array([float(comm.rank)])
    comm.all_reduce(z, group=dm["cp"])  # a dimension of size 1: this rank alone
    return (list(dm["tp"].ranks), list(dm["pp"].ranks), list(dm["dp"].ranks), dm.get_local_rank("pp"), x[0], y[0], z[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["local", "torch-native"])
def test_device_mesh_groups_follow_megatron_order(backend):
    from netmorph.runtime import launch

    out = launch(_device_mesh, 8, backend=backend)
    # tp innermost: [0, 1]; dp next: [0, 2]; pp outermost: [0, 4]
    assert out[0] == ([0, 1], [0, 4], [0, 2], 0, 1.0, 2.0, 0.0)
    assert out[7] == ([6, 7], [3, 7], [5, 7], 1, 13.0, 12.0, 7.0)
