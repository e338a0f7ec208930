"""The transcripts in README.md and docs/ are real runs: scripts/transcripts.py made them, and the quick ones
rerun here to the same deterministic fields (bytes, rounds, closed forms, float64 losses, error lines).

The slow ones (the tour, morph's and launch's runs, the benchmarks) rerun with
``python scripts/transcripts.py --check`` (and ``--slow``); their directive records how long they took.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import transcripts  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
QUICK = 1.5  # seconds: a transcript whose last run took at most this long reruns in the suite


def _all():
    for page in PAGES:
        for b in transcripts.blocks(page.read_text().split("\n")):
            yield page, b


def test_every_command_page_has_transcripts_and_every_transcript_says_how_it_was_made():
    found = list(_all())
    pages = {p for p, _ in found}
    commands = sorted((ROOT / "docs" / "commands").glob("*.md"))
    assert len(commands) >= 14 and set(commands) <= pages, sorted(set(commands) - pages)
    for page, b in found:
        where = f"{page.relative_to(ROOT)}:{b.start + 1}"
        assert b.mark is not None, f"{where}: no <!-- transcript: ... --> line (run scripts/transcripts.py)"
        assert b.manual or b.options.get("seconds", 0) > 0, where
        assert all(out or b.manual for command, out in b.runs), f"{where}: no output"


def test_the_readme_is_short_and_its_example_is_a_transcript():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split("\n")) <= 250
    (b,) = transcripts.blocks(readme.split("\n"))
    command, out = b.runs[0]
    assert command.startswith("netmorph train") and any("✓" in line for line in out)


@pytest.mark.timeout(300)
def test_the_quick_transcripts_rerun_to_the_same_deterministic_fields():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "transcripts.py"),
            "--check",
            "--skip-timing",
            "--max-seconds",
            str(QUICK),
            *map(str, PAGES),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    ran = [line for line in r.stderr.splitlines() if line.endswith(" s")]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert len(ran) >= 12, r.stderr


def test_a_moved_field_is_found_and_a_moved_time_is_not(tmp_path):
    """The check is not vacuous: one byte count changed in a documented table fails it; a time (a number with
    its unit) changed does not."""
    page = ROOT / "docs" / "commands" / "collective.md"
    text = page.read_text()
    row = next(line for line in text.split("\n") if " ring " in line and "117,440,512" in line)
    assert "170.374 ms predicted" in text
    timed = tmp_path / "timed.md"
    timed.write_text(text.replace("170.374 ms predicted", "171.374 ms predicted"))
    moved = tmp_path / "moved.md"
    moved.write_text(text.replace(row, row.replace("117,440,512", "117,440,513", 1)))
    assert transcripts.process(timed, check=True, slow=False, max_seconds=1.0, timeout=60) == []
    (problem,) = transcripts.process(moved, check=True, slow=False, max_seconds=1.0, timeout=60)
    assert "117,440,513" in problem and "117,440,512" in problem


def test_the_directive_reads_back():
    assert transcripts.parse_options("1.4 s, slow, compare numbers") == {
        "seconds": 1.4,
        "slow": True,
        "compare": "numbers",
    }
    assert transcripts.parse_options("3 s, timing") == {"seconds": 3.0, "timing": True}
    assert transcripts.parse_options("manual: needs a second shell") == {"manual": "needs a second shell"}
    with pytest.raises(ValueError, match="unknown"):
        transcripts.parse_options("2 s, sometimes")
