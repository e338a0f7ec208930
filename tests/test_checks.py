"""The rules a command refuses bad input by are the packages' own: a library caller meets the same rule, with
the field to change named, and the CLI only spells that field as its flag. No process is started here."""

import pytest

from netmorph.consistency import Config
from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.moe import MoEConfig
from netmorph.morph.controller import check_run
from netmorph.morph.layouts import check_move
from netmorph.morph.scenario import parse_scenario
from netmorph.serving.engine import check_deployment
from netmorph.serving.workload import load

SMALL = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)


def refused(fn, *a, **kw) -> UsageError:
    with pytest.raises(UsageError) as e:
        fn(*a, **kw)
    return e.value


@pytest.mark.parametrize(
    "fields, argument",
    [
        ({"mode": "gossip"}, "mode"),
        ({"model": "resnet"}, "model"),
        ({"workers": 33}, "workers"),
        ({"workers": 2, "servers": 1, "slow_link": (0, 3, 1e-4, 1e8)}, "slow_link"),
    ],
)
def test_consistency_config_owns_its_rules(fields, argument):
    assert refused(Config(**fields).check).argument == argument
    Config(workers=2, servers=1, slow_link=(0, 2, 1e-4, 1e8)).check()  # rank 2 is the server: a rank of the run


@pytest.mark.parametrize(
    "world, steps, segment, scenario, argument",
    [
        (3, 100, 10, "none", "world"),
        (8, 1, 10, "none", "steps"),
        (8, 100, 101, "none", "segment"),
        (2, 100, 10, "node-lost@40", "scenario"),
        (8, 100, 10, "seq-grows@10x8", "scenario"),
    ],
)
def test_morph_run_rules(world, steps, segment, scenario, argument):
    model = (
        SMALL if argument != "scenario" or world == 2 else ModelShape(layers=4, hidden=32, heads=4, seq=1024, vocab=64)
    )
    e = refused(check_run, model, world, 8, steps, segment, parse_scenario(scenario))
    assert e.argument == argument
    assert "--" + argument in e.render({}) and "{" not in e.render({})
    check_run(SMALL, 8, 8, 100, 10, parse_scenario("link-degrades@40"))  # the default runs


def test_morph_run_needs_a_layout_for_every_regime():
    # one layer of one head on 8 ranks: only dp8 runs it, and a global batch of 3 does not split 8 ways
    one = ModelShape(layers=1, hidden=32, heads=1, seq=16, vocab=64)
    assert refused(check_run, one, 8, 3, 100, 10, parse_scenario("none")).argument == "global_batch"
    check_run(one, 8, 8, 100, 10, parse_scenario("none"))


def test_reshard_world_and_steps():
    assert refused(check_move, 17, 2).argument == "world"
    assert refused(check_move, 4, 0).argument == "steps"
    check_move(16, 1000)


def test_serving_deployment_rules():
    assert refused(check_deployment, 2, None, 1, False).argument == "tp"  # timed on each rank's clock
    assert refused(check_deployment, 2, (1, 1), 1, True).argument == "tp"
    assert refused(check_deployment, 1, (1, 1), 2, True).argument == "n"
    check_deployment(2, None, 4, True)
    check_deployment(1, (1, 2), 1, False)


def test_workload_with_no_readable_line_is_refused(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt_len": 0, "output_len": 4, "arrival_s": 0}\n[1]\n')
    e = refused(load, str(f), 64, 64)
    assert e.argument == "workload" and "2 line(s) rejected; line 1: prompt_len" in str(e)
    f.write_text('{"prompt_len": 3, "output_len": 4, "arrival_s": 0}\n[1]\n')
    reqs, bad = load(str(f), 64, 64)
    assert len(reqs) == 1 and [k for k, _ in bad] == [2]


def test_moe_world_is_the_product_of_its_split():
    e = refused(MoEConfig.make, split=Layout(ep=2, dp=2, tp=2), world=8)
    assert e.argument == "world" and "= 4" in str(e)
    assert MoEConfig.make(split=Layout(ep=2, dp=2, tp=2), world=4).world == 4


def test_a_collective_request():
    from netmorph.collectives import ALGORITHMS, check_request

    assert refused(check_request, "allreduce", "ring", 4, [1024, 6], 4).argument == "nbytes"
    assert refused(check_request, "broadcast", "binomial", 4, [1024], 4, root=4).argument == "root"
    assert refused(check_request, "allreduce", "ring", 4, [1024], 4, segments=2).argument == "segments"
    assert refused(check_request, "allreduce", "tree", 4, [1024], 4).argument == "algo"
    assert check_request("all_reduce", "all", 4, [1024], 4, segments=2) == list(ALGORITHMS["allreduce"])
    assert check_request("allgather", "bruck", 4, [1024], 4, root=5) == ["bruck"]  # a rank, though unused
