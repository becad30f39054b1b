# Skyscan developer entry points. `make test` and `make up` set up everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CLUSTER_DIR ?= .skyscan/cluster

.PHONY: venv uv lock audit-deps binaries crds check-crds chart-schema lint test test-fast test-unit mutate bench cluster-up cluster-down up down reset status demo audit-node clean

# Every Python package the venv holds is pinned, with its files' hashes, in requirements/venv.txt
# (`make lock` writes it from the pyprojects; the image installs requirements/image.txt, the
# product's part of it). pip installs the installer, uv (requirements/uv.txt, pinned and hashed too),
# which installs the lock (in parallel: 4-12 s cold where pip took 3.5 min); the two projects go in
# after it, editable, without dependencies and built by the locked setuptools. `uv pip check` then
# fails when a pyproject asks for what the lock lacks.
LOCK := requirements/venv.txt
UV   := $(VENV)/bin/uv
venv: $(STAMP)
$(STAMP): pyproject.toml local/pyproject.toml $(LOCK) requirements/uv.txt
	test -x $(UV) || $(MAKE) --no-print-directory uv
	$(UV) pip install -q --python $(PY) --require-hashes -r $(LOCK)
	$(UV) pip install -q --python $(PY) --no-deps --no-build-isolation -e . -e ./local   # the product (with `skyscan plot`), then the local harness
	@$(UV) pip check -q --python $(PY) || { \
	  echo "$(LOCK) does not satisfy the pyprojects: \`make lock\` adds what they ask for" >&2; exit 1; }
	touch $@

# uv resolves for the Python and platform every machine here has (CPython 3.11, x86_64 glibc); a pin
# already in the lock is kept while it still fits. UPGRADE=1: every package at the newest that fits.
UPGRADE ?=
COMPILE = $(UV) pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --no-emit-package skyscan --no-emit-package skyscan-local \
	--custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade)
lock:                   ## re-resolve requirements/*.txt after a pyproject's dependencies change (UPGRADE=1: all of them)
	test -x $(UV) || $(MAKE) --no-print-directory uv
	$(COMPILE) requirements/venv.in -o $(LOCK)
	$(COMPILE) requirements/image.in --constraint $(LOCK) -o requirements/image.txt
	echo uv | $(COMPILE) - --constraint $(LOCK) -o requirements/uv.txt
	$(COMPILE) local/scanner_image/requirements.in --constraint $(LOCK) -o local/scanner_image/requirements.txt

# The venv without pip (ensurepip's install of it took 28 s of a cold `make venv` on a busy machine: the
# lock brings pip), and uv into it by the host's pip; by ensurepip's where the host has none.
uv:
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(PY) install -q --require-hashes --no-deps -r requirements/uv.txt \
	  || { $(PY) -m ensurepip >/dev/null && $(PY) -m pip install -q --require-hashes --no-deps -r requirements/uv.txt; }

audit-deps: venv        ## pip-audit: the locked versions against PyPI's advisories (needs PyPI's JSON API; says so when not answered)
	$(PY) tools/audit_deps.py $(LOCK)

binaries:               ## build the control-plane binaries and helm once into ~/.cache/skyscan/k8s/<version>
	bash tools/k8s/build.sh

crds: venv              ## regenerate crds/ from the domain model (and its copies in manifests/crds/, the chart's crds/)
	$(PY) -m skyscan.crd
	cp crds/*.yaml manifests/crds/
	cp crds/*.yaml charts/skyscan/crds/

check-crds: venv
	$(PY) -m skyscan.crd --check
	diff -r crds manifests/crds
	diff -r crds charts/skyscan/crds

chart-schema: venv      ## regenerate the `settings` of charts/skyscan/values.schema.json from the settings classes
	$(PY) -m skyscan_local.chart_schema

lint: venv              ## ruff, mypy strict, the layering contracts (pyproject's [tool.importlinter]), Scans read through accessors
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/raw_access.py

# pytest-xdist workers, each with its own control plane and PostgreSQL (tests/conftest.py); most tests
# wait on timers and processes rather than compute, hence more workers than the 2 cores. --dist worksteal
# with tests/conftest.py's scheduler keeps every real-node test on one worker, in order, from the
# start. TEST_WORKERS=0: serial.
# More than 3 only adds control planes: 4 (whole suite) and 5 (test-fast) were slower, both cores busy.
TEST_WORKERS ?= 3
# Byte-compiled modules are kept (in the gitignored __pycache__ dirs), whatever the shell says: every
# operator, shim and simulator a test starts, and every xdist worker's rewritten test modules, would
# otherwise be compiled again from source (test-fast's collection: 5.2 s of CPU a worker, 3.0 s kept).
unexport PYTHONDONTWRITEBYTECODE
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

test: lint              ## lint, then the whole suite against a real control plane (or SKYSCAN_TEST_KUBECONFIG)
	@# As root with apt, the real node's Debian packages and the dashboard's browser (Debian's
	@# chromium, which Playwright drives) come first, so their tests run (README, Tests).
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  bash tools/node/packages.sh && bash tools/debian/install.sh chromium; fi
	@# Keycloak from Maven Central, the dashboard's login test's OIDC issuer (cached outside the repo);
	@# without it that test is skipped, saying so.
	@bash tools/keycloak/install.sh >/dev/null || echo "KEYCLOAK NOT INSTALLED: the dashboard's OIDC login test will be skipped" >&2
	bin=$$(bash tools/k8s/build.sh) && SKYSCAN_K8S_BIN_READY=$$bin $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: venv         ## the inner loop: tests/unit and the shim's integration tests (no lint, no operator, no e2e)
	bin=$$(bash tools/k8s/build.sh) && SKYSCAN_K8S_BIN_READY=$$bin $(PY) -m pytest $(XDIST) tests/unit tests/integration/shim $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

SINCE ?=
mutate: venv            ## mutation testing of the identity and bounds code (tools/mutate); SINCE=<ref>|auto: what changed
	$(PY) tools/mutate/run.py $(if $(SINCE),--since $(SINCE))

QUICK ?=
bench: venv             ## the benchmark suite, one markdown table (README, Benchmarks); QUICK=1: CI's small size
	bin=$$(bash tools/k8s/build.sh --bench) && SKYSCAN_K8S_BIN_READY=$$bin $(PY) tools/bench/suite.py $(if $(QUICK),--quick)

cluster-up: venv binaries   ## start the local control plane; prints the kubeconfig path
	$(VENV)/bin/skyscan-cluster up --dir $(CLUSTER_DIR)

cluster-down: venv
	$(VENV)/bin/skyscan-cluster down --dir $(CLUSTER_DIR)

SIMULATE_SCANNER ?= 1
NODE ?=

# The whole stack in the background (builds the control-plane binaries once if missing); writes
# .skyscan/env. With SKYSCAN_KUBECONFIG set it uses that cluster instead of the local control plane.
# NODE=real: Skyscan installed by its own Helm chart onto a real kubelet (skyscan_local.real_stack; root).
up: venv
ifeq ($(NODE),real)
	$(PY) -m skyscan_local.real_stack up
else
	SIMULATE_SCANNER=$(SIMULATE_SCANNER) $(PY) -m skyscan_local.stack up
endif

down:                   ## stop exactly what `make up` started; its data stays (`make up` brings it back)
	@if [ -x $(PY) ]; then $(PY) -m skyscan_local.real_stack down && $(PY) -m skyscan_local.stack down; fi

reset: venv             ## after `make down`: delete the local stack's data (every Scan, the archive, logs, tokens)
	$(PY) -m skyscan_local.real_stack reset && $(PY) -m skyscan_local.stack reset

# The documentation site (mkdocs.yml, docs/), built with warnings as errors: a link to a page or a
# heading that does not exist fails it. Internal links only: external ones are not fetched (CI's
# machines reach the package registries alone). The generated tables (settings, REST routes) must
# match the code first.
.PHONY: docs docs-serve docs-reference
docs: venv              ## build the documentation site into site/ (strict; internal links checked; generated pages current)
	$(PY) -m skyscan_local.docs_reference --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: venv        ## serve the documentation site at http://127.0.0.1:8000, rebuilt as docs/ changes
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

docs-reference: venv    ## regenerate docs/'s settings and REST route tables from the settings classes and the OpenAPI document
	$(PY) -m skyscan_local.docs_reference

audit-node: venv        ## an attacker's probes against the running `make up NODE=real` stack: each must be refused
	$(PY) -m skyscan_local.audit

status: venv
	@$(PY) -m skyscan_local.stack status

demo: venv              ## one scan through REST to its final result and its skymap .skyscan/skymap-<id>.png (starts the scanner simulator)
	@$(MAKE) --no-print-directory up SIMULATE_SCANNER=1 >/dev/null
	$(PY) -m skyscan_local.demo

clean: down              ## the virtualenv and caches (the stack's data stays: `make reset` deletes it)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
