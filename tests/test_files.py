"""Output files are written atomically: never half-written, never through a planted name."""

import os

import pytest

from netmorph.files import atomic_path, write_json, write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            with open(tmp, "w") as fh:
                fh.write("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["report.html"]


def test_a_planted_symlink_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "trace.json"
    link.symlink_to(victim)
    write_json(link, {"traceEvents": []})
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == '{"traceEvents": []}'


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
