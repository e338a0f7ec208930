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


# ---------------------------------------------------------------- output paths, checked before any work
import stat  # noqa: E402

import fuzz  # noqa: E402

from netmorph.cli import main  # noqa: E402
from netmorph.files import output_problem  # noqa: E402

# one quick command per kind of output flag: the path goes last
WRITERS = {
    "--plot": ["failures", "--gpus", "1024", "--trials", "5", "--days", "5", "--plot"],
    "--trace": ["simulate", "step", "--model", "ptdp-1.7b", "--dp", "2", "--global-batch", "4", "--trace"],
}


@pytest.mark.parametrize("flag", list(WRITERS))
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_is(flag, tmp_path, capsys):
    for path, kind in fuzz.specials(str(tmp_path), (".png" if flag == "--plot" else ".json",)).items():
        before = os.lstat(path).st_mode
        code = main(WRITERS[flag] + [path])
        err = capsys.readouterr().err
        assert code == 2, (kind, err)
        assert len(err.strip().splitlines()) == 1 and flag in err and "not" in err and "regular file" in err, (
            kind,
            err,
        )
        assert os.lstat(path).st_mode == before, f"the {kind} at {path} was replaced"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".netmorph-")]


@pytest.mark.parametrize(
    "value, words",
    [
        ("", "is empty"),
        ("x" * 300 + ".json", "at most"),
        ("trace", "no extension"),
        ("trace.png", "use one of .json"),
        ("missing-dir/t.json", "does not exist"),
    ],
)
def test_a_trace_path_the_writer_cannot_produce_is_refused_before_the_run(value, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(WRITERS["--trace"] + [value]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_a_plot_path_needs_an_extension_matplotlib_saves(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for value, words in (
        ("goodput", "no extension; end it in .png"),
        ("goodput.docx", "cannot write a .docx"),
        ("goodput.pgf" if output_problem("x.pgf", ("png",)) else "goodput.xyz", "cannot write"),
    ):
        assert main(WRITERS["--plot"] + [value]) == 2
        assert words in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # never an empty file
    assert main(WRITERS["--plot"] + ["goodput.svg"]) == 0
    assert (tmp_path / "goodput.svg").read_text().lstrip().startswith("<?xml")
    assert sorted(os.listdir(tmp_path)) == ["goodput.svg"]


def test_the_last_look_before_replace_never_turns_a_special_file_into_a_file(tmp_path):
    """The parse-time check can be raced: atomic_path looks again just before os.replace."""
    from netmorph.errors import UsageError

    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        write_json(fifo, {})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["t.json"]


def test_a_link_to_a_regular_file_is_replaced_a_link_to_a_device_refused(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    (tmp_path / "ok.json").symlink_to(plain)
    assert output_problem(tmp_path / "ok.json", ("json",)) is None
    (tmp_path / "stdout.json").symlink_to("/dev/null")
    assert "link to a character device" in output_problem(tmp_path / "stdout.json", ("json",))


@pytest.mark.timeout(30)
def test_the_tour_refuses_a_report_folder_holding_a_fifo_under_a_figure_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "rep"
    out.mkdir()
    os.mkfifo(out / "plan_splits.png")
    assert main(["tour", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "plan_splits.png" in err and "FIFO" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(out)) == ["plan_splits.png"]
    (tmp_path / "file").write_text("x")
    assert main(["tour", "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["tour", "--out", ""]) == 2 and "empty" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["file", "rep"]
