# Two entry points do all set-up on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 4

# the example plugin and source are installed as packages of their own, as a backend team's would be: the
# tests use them
$(STAMP): pyproject.toml examples/tenant_allowlist/pyproject.toml examples/jsonl_events/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]' -e examples/tenant_allowlist \
		-e examples/jsonl_events
	touch $(STAMP)

.PHONY: install run test test-fast check dist bench cluster docs reference
install: $(STAMP)

run: $(STAMP)
	$(PY) -m scripts.run_stack

# installs what pip cannot (redis-server, nginx, promtool) when missing, then runs every test
# in parallel, one test file per worker at a time (a file's servers are shared by its tests)
test: $(STAMP)
	scripts/ensure_test_services.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# the tests that start no server, for every save (under two minutes)
test-fast: $(STAMP)
	$(PY) -m pytest -q -m inprocess $(PYTEST_ARGS)

# docs/reference/*.md from the code (config models, error codes, metrics); a test fails when one is out of date
reference: $(STAMP)
	$(PY) -m scripts.gen_reference

# the documentation site, built strict: a broken link or a page missing from the nav fails it
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# lint and type-check: zero findings (CI runs this before the tests)
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# both distributions, each as sdist and wheel (the wheel built from the sdist), into dist/, checked by twine:
# export-gateway (the root: everything) and exports-client (sdk/: the client SDK and exportctl alone)
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m build --outdir dist sdk
	$(VENV)/bin/twine check --strict dist/*

# Redis, an S3-compatible store, 2 backends, 2 gateways and nginx in front, until Ctrl-C; STORE=postgresql: the
# backends keep their tasks in a database of their own on TEST_POSTGRES_URL's server (or CLUSTER_DATABASE_URL)
cluster: $(STAMP)
	command -v redis-server >/dev/null && command -v nginx >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server nginx-light)
	$(PY) -m scripts.run_cluster up $(if $(STORE),--store $(STORE)) $(if $(CLUSTER_DATABASE_URL),--database-url $(CLUSTER_DATABASE_URL))

bench: $(STAMP)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) -m benchmarks.run_all
