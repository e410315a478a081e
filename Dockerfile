# The controller's own image: `patchbox serve` (or any patchbox command) in a container that
# drives the host's Docker daemon through its socket. compose.yaml runs it; docs/service.md
# ("Running it with Docker Compose") says what the container needs from the host.
#
# BASE_IMAGE: any image with python3 >= 3.11 and either pip or Debian's apt. A slim Python
# image by default; where no image can be pulled, the base `patchbox image build` made
# locally (`docker images patchbox-base`).
#
# The build installs patchbox and its dependencies with pip. Where the build cannot reach
# the package index, put wheels in a `.wheels/` folder of the build context first
# (`pip wheel --wheel-dir .wheels .`): they are installed from there, with no network.
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

ARG PATCHBOX_UID=10002
ARG PATCHBOX_GID=10002
USER root

# git (the controller's baselines, apply and revert) and a Python venv; apt only if the
# base lacks them.
RUN set -eu; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'; \
    need=""; \
    command -v git >/dev/null 2>&1 || need="$need git"; \
    python3 -c 'import ensurepip, venv' 2>/dev/null || need="$need python3-venv"; \
    if [ -n "$need" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $need ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi

COPY . /opt/patchbox/src
RUN set -eu; \
    python3 -m venv /opt/patchbox/venv; \
    pip=/opt/patchbox/venv/bin/pip; \
    if ls /opt/patchbox/src/.wheels/patchbox-*.whl >/dev/null 2>&1; then \
        $pip install --no-cache-dir --disable-pip-version-check --no-index \
            --find-links /opt/patchbox/src/.wheels patchbox; \
    else \
        $pip install --no-cache-dir --disable-pip-version-check /opt/patchbox/src; \
    fi; \
    rm -rf /opt/patchbox/src; \
    /opt/patchbox/venv/bin/patchbox --version

# A non-root user; compose.yaml adds the Docker socket's group to it. The state directory
# is a volume owned by that user.
RUN set -eu; \
    grep -q '^patchbox:' /etc/group || echo "patchbox:x:${PATCHBOX_GID}:" >> /etc/group; \
    grep -q '^patchbox:' /etc/passwd || echo \
        "patchbox:x:${PATCHBOX_UID}:${PATCHBOX_GID}:patchbox:/var/lib/patchbox:/usr/sbin/nologin" \
        >> /etc/passwd; \
    mkdir -p /var/lib/patchbox /etc/patchbox; \
    chown "${PATCHBOX_UID}:${PATCHBOX_GID}" /var/lib/patchbox; \
    chmod 0700 /var/lib/patchbox

ENV PATH=/opt/patchbox/venv/bin:$PATH \
    PATCHBOX_HOME=/var/lib/patchbox \
    HOME=/var/lib/patchbox \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER ${PATCHBOX_UID}:${PATCHBOX_GID}
WORKDIR /var/lib/patchbox
VOLUME /var/lib/patchbox
EXPOSE 8765

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8765/healthz', timeout=4).status != 200)"]

ENTRYPOINT ["patchbox"]
CMD ["serve", "--config", "/etc/patchbox/config.toml", "--host", "0.0.0.0", "--port", "8765"]
