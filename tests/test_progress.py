"""The progress a long command shows off a terminal (a log file, CI, ``make demo | tee``): plain lines at
most ``every`` seconds apart while a task runs and one when it ends; nothing for a command done sooner."""

import time

import pytest

from netmorph.cli.progress import Bar


def test_a_quick_task_prints_nothing(capsys):
    with Bar("serve", tty=False, every=5.0) as bar, bar.task("serving", 3) as t:
        bar.update(t, completed=3)
    assert capsys.readouterr().err == ""


def test_a_long_task_prints_its_progress_then_done(capsys):
    with Bar("train", unit="steps", tty=False, every=0.2) as bar, bar.task("training on 4 ranks", 10) as t:
        bar.update(t, completed=3)
        time.sleep(0.5)  # the ticker looks every min(1 s, every)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("netmorph train: training on 4 ranks: 3/10 steps ("), lines
    assert lines[-1].startswith("netmorph train: training on 4 ranks: 10/10 steps (") and lines[-1].endswith(" done")


def test_a_task_that_raises_is_not_reported_done(capsys):
    with pytest.raises(RuntimeError):
        with Bar("moe", tty=False, every=0.2) as bar, bar.task("training on 2 ranks"):
            time.sleep(0.5)
            raise RuntimeError("a rank failed")
    err = capsys.readouterr().err
    assert "netmorph moe: training on 2 ranks: (" in err and "done" not in err, err
