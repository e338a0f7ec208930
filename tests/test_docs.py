"""Every Python block in README.md and docs/ runs as it is written (extracted and executed, bounded in time).

An example that no test runs goes stale: the README's ``train`` example indexed its result like a dict after
``train`` had come to return a :class:`~netmorph.parallel.run.TrainSummary`, and raised ``TypeError``.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_the_pages_have_python_blocks():
    assert len(BLOCKS) >= 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize("code", BLOCKS)
def test_every_python_block_runs(code, tmp_path):
    """Each block in a fresh interpreter, in a folder of its own (an example may write a file)."""
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.timeout(120)
def test_the_docs_site_builds_strictly(tmp_path):
    """mkdocs.yml's pages (docs/, mkdocs-material from the dev extra) build with no warning: every nav entry
    exists and every link between pages resolves."""
    exe = Path(sys.executable).parent / "mkdocs"
    assert exe.exists(), "mkdocs is not installed: pip install -e '.[dev]' (make test does)"
    r = subprocess.run(
        [str(exe), "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "site" / "extending" / "index.html").exists()
