"""The validator catches broken schedules: each mutation of a correct one names its round."""

import pytest
from cases import ALL

from netmorph.collectives import build
from netmorph.collectives.base import layout
from netmorph.schedule import COPY, REDUCE, Round
from netmorph.schedule.validate import ScheduleError


@pytest.mark.parametrize("op,algo", ALL)
def test_correct_schedules_pass(op, algo):
    for p in (1, 2, 5, 8):
        build(op, algo, p, 3 * p + 2, 4).validate()


def test_send_before_hold():
    s = layout("broadcast", "bad", 3, 4, 4, root=0)
    s.add([1], [2], [0], [0], [4], COPY)  # rank 1 has nothing yet
    with pytest.raises(ScheduleError, match="round 0: rank 1 sends elements \\[0, 4\\) it does not hold yet"):
        s.validate()


def test_double_count():
    s = build("allreduce", "ring", 4, 8, 4)
    s.rounds.insert(1, s.rounds[0])  # the same reduce step twice
    with pytest.raises(ScheduleError, match="twice"):
        s.validate()


def test_write_race():
    s = layout("allgather", "bad", 3, 3, 4)
    s.add([0, 1], [2, 2], [0, 1], [0, 0], [1, 1], COPY)  # two copies into rank 2's element 0
    with pytest.raises(ScheduleError, match="same elements"):
        s.validate()


def test_missing_round_leaves_partial_output():
    s = build("allreduce", "ring", 4, 8, 4)
    del s.rounds[-1]
    with pytest.raises(ScheduleError, match="ends with wrong or partial data"):
        s.validate()


def test_reduce_of_different_elements():
    s = layout("allreduce", "bad", 2, 4, 4)
    s.add([0], [1], [0], [2], [2], REDUCE)  # element 0 of rank 0 into element 2 of rank 1
    with pytest.raises(ScheduleError, match="combines different elements"):
        s.validate()


def test_out_of_bounds_and_bad_rank():
    s = layout("allreduce", "bad", 2, 4, 4)
    s.add([0], [1], [2], [2], [3], COPY)
    with pytest.raises(ScheduleError, match="past the end"):
        s.validate()
    s = layout("allreduce", "bad", 2, 4, 4)
    s.rounds.append(Round([0], [5], [0], [0], [1], COPY))
    with pytest.raises(ScheduleError, match="outside"):
        s.validate()


def test_message_rows_must_agree():
    s = layout("allgather", "bad", 3, 3, 4)
    s.add([0, 1], [1, 2], [0, 1], [0, 1], [1, 1], COPY, msg=[0, 0])  # one message, two peers
    with pytest.raises(ScheduleError, match="mixes peers"):
        s.validate()
