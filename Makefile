# rkaudio: two venvs (export: torch/onnx/model packages; convert-<ver>: rknn-toolkit2, strict pins),
# the engines a release ships, and the tests. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV_DIR ?= .venv
RKNN_TOOLKIT ?= 2.3.2
TARGET ?= rk3588
# CI builds the small-graph engine with both toolkits, so `make test` creates both converter venvs.
TEST_TOOLKITS ?= 2.3.2 2.5.0
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`: one per core here; the `slow` tests share one worker (tests/conftest.py), so
# the suite's peak is one real-size build plus one small test. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
# pytest's -m expression: `make test` runs every test, `make test-quick` leaves the `slow` ones out (pyproject.toml).
TEST_MARKERS ?=
# `make engines -j N` (GNU make puts -jN in MAKEFLAGS) or JOBS=N: packages built in parallel, bounded by memory.
JOBS ?= $(or $(patsubst -j%,%,$(filter -j%,$(MAKEFLAGS))),1)

EXPORT_PY := $(VENV_DIR)/export/bin/python
export RKAUDIO_VENV_DIR := $(abspath $(VENV_DIR))

.PHONY: help venvs venv-export venv-convert engines test test-quick bench clean-venvs
help:
	@echo "make venvs [RKNN_TOOLKIT=2.3.2|2.5.0]  create .venv/export and .venv/convert-<ver> (idempotent)"
	@echo "make engines TARGET=rk3588 [ONLY=pkg]  build every recipe whose checkpoint is present into dist/<target>/"
	@echo "make test                              create the venvs if missing, run the test suite"
	@echo "make test-quick                        the same without the slow tests (real-size or real-checkpoint engines)"
	@echo "make bench NAME=<bench> [ARGS=...]     run bench/<bench>.py (table + bench/results/<bench>.json); ARGS=--help: its options"

venvs: venv-export venv-convert

# Each venv is rebuilt only when its pin files change: the stamp holds their sha256.
venv-export:
	@bash venvs/ensure.sh export $(VENV_DIR)/export venvs/export.txt venvs/export-nodeps.txt

venv-convert:
	@bash venvs/ensure.sh convert $(VENV_DIR)/convert-$(RKNN_TOOLKIT) venvs/convert-$(RKNN_TOOLKIT).txt

engines: venvs
	$(EXPORT_PY) -m rkaudio.cli engines --target $(TARGET) --toolkit $(RKNN_TOOLKIT) --jobs $(JOBS) $(if $(ONLY),--only $(ONLY))

PYTEST_RUN = $(EXPORT_PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(if $(TEST_MARKERS),-m '$(TEST_MARKERS)') $(PYTEST_ARGS)
test-quick: TEST_MARKERS = not slow

test test-quick: venv-export
	@for v in $(TEST_TOOLKITS); do $(MAKE) --no-print-directory venv-convert RKNN_TOOLKIT=$$v || exit 1; done
	@echo "$(PYTEST_RUN)"
	@# pytest exits 5 when it collected nothing (run from elsewhere, a testpaths typo, -m selecting none): never a pass.
	@$(PYTEST_RUN); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "make $@: pytest collected no tests (exit 5)" >&2; fi; exit $$status

bench: venvs
	@test -n "$(NAME)" || { echo "usage: make bench NAME=<name> [ARGS=\"<options>\"]  (bench/<name>.py)" >&2; exit 2; }
	$(EXPORT_PY) bench/run.py $(NAME) $(ARGS)

clean-venvs:
	rm -rf $(VENV_DIR)
