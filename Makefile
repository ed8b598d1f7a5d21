# Entry points. `make test` and `make demo` do all set-up on a fresh machine.
# ../shared is the team's shared folder, a sibling of this repository (also in CI).

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# Inside the venv, so deleting it also forces a reinstall.
STAMP := $(VENV)/.ndq_tf-installed
# The extras installed into the venv, and requirements pinned with them.
EXTRAS ?= test,bench
PINS ?=
# The oldest supported TensorFlow and Keras (pyproject.toml's lower bounds,
# ndq_tf.core.tf_internals; tests/test_packaging.py keeps them equal),
# with the tf_keras of that TensorFlow. `make test-oldest` runs the oldest
# tier on them in .venv-oldest; .ci/run runs it, then `make test`.
OLDEST := tensorflow==2.18.* keras==3.10.* tf-keras==2.18.*
# A TensorFlow already in the venv stays: pinned, so that the test extra's
# tf-keras is the one of its minor version (pip would otherwise upgrade
# TensorFlow to the newest tf-keras').
KEEP_TF := $(VPY) -c 'import importlib.metadata as m; print("tensorflow==" + m.version("tensorflow"))' 2>/dev/null || true
SHARED := ../shared
# Each pytest-xdist worker is one process; tests/conftest.py splits its CPU
# into logical devices. A pytest run that collects nothing exits 5 (a failure).
PYTEST_ARGS ?= -n 2 --dist loadfile -q
BAZEL_TARGETS ?= //...
# The quick benchmarks. Not here: benchmarks/multi_worker_link.py (needs root
# for network namespaces), benchmarks/paper_experiment.py (30+ minutes per
# seed, resumable; benchmarks/paper_report.py rebuilds docs/results.md from
# its runs) and benchmarks/nested_digits.py (about 10 minutes); see
# docs/benchmarks.md, docs/results.md and docs/nested_digits.md.
BENCHMARKS := benchmarks/codec_throughput.py benchmarks/mirrored_step.py \
	benchmarks/nested_tradeoff.py

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# CI runs as root.
export PIP_ROOT_USER_ACTION := ignore

.PHONY: venv venv-oldest test test-quick test-oldest coverage demo bench \
	check-accuracy bazel-test check-build lint-build clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[$(EXTRAS)]' $(PINS) $$($(KEEP_TF))
	touch $@

# The whole suite.
test: venv
	$(VPY) -m pytest tests $(PYTEST_ARGS)

# The whole suite's line coverage of ndq_tf/, worker processes included
# (pyproject.toml's [tool.coverage.run]); pytest-cov is installed here only.
coverage: venv
	$(VPY) -m pip install --quiet pytest-cov
	$(VPY) -m pytest tests $(PYTEST_ARGS) --cov --cov-report=term

# The tiers are tests/BUILD's tags, as pytest markers (tests/conftest.py).
# The quick tier: the test files tagged "quick".
test-quick: venv
	$(VPY) -m pytest tests $(PYTEST_ARGS) -m quick

# The oldest supported versions' venv.
venv-oldest:
	$(MAKE) venv VENV=.venv-oldest EXTRAS=test PINS="$(OLDEST)"

# The oldest-versions tier (tag "oldest"), on the oldest supported versions.
test-oldest: venv-oldest
	.venv-oldest/bin/python -m pytest tests $(PYTEST_ARGS) -m oldest

demo: venv
	$(VPY) examples/fit_mirrored.py

bench: venv
	@test -n "$(BENCHMARKS)" || { echo "no benchmarks/*.py found" >&2; exit 1; }
	set -e; for script in $(BENCHMARKS); do \
	  echo "== $$script"; $(VPY) $$script; \
	done

# The accuracy claims that were tests (issue #31), with their thresholds:
# exits 1 if one fails, and writes docs/accuracy_checks.md (about 3 minutes).
check-accuracy: venv
	$(VPY) benchmarks/check_accuracy.py

bazel-test: venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(SHARED)/tools/bazel-test $(BAZEL_TARGETS)

# Bazel loads and analyzes //... (no build, no test run), and every Python
# file of ndq_tf/ and tests/ has a target (tools/check_build.py); in CI.
check-build: venv
	$(VPY) tools/check_build.py

lint-build:
	$(SHARED)/tools/buildifier -mode=check -lint=warn -r .

clean:
	rm -rf build dist *.egg-info .pytest_cache bazel-*
	find . \( -path ./.venv -o -path ./.venv-oldest \) -prune -o \
	  -name __pycache__ -type d -exec rm -rf {} +
