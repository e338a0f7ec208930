# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0

.PHONY: demo test bench docs transcripts clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# the pinned CPU build first: an unpinned torch pulls a multi-GB CUDA build
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/netmorph tour --out report

# two workers, whole files each: most tests wait on processes, timeouts and emulated links, so two at a time
# on two cores halve the wall time; a file's tests share one worker (their module fixtures, their order)
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/python benchmarks/scale.py

# the documentation site (mkdocs-material, the dev extra) into site/; strict: a broken link or nav entry fails
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# every command transcript in README.md and docs/ rerun and rewritten (--slow adds the benchmarks')
transcripts: $(STAMP)
	$(BIN)/python scripts/transcripts.py

clean:
	rm -rf $(VENV) report build site *.egg-info netmorph.egg-info
