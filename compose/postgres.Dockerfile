# PostgreSQL for compose.yaml's `replicas` profile: the database several `patchbox serve`
# replicas share (docs/service.md, "Replicas"). Debian's server, run as the controller's
# user (PATCHBOX_UID, PATCHBOX_GID) with one cluster in PGDATA, a folder of the state volume
# mounted at /var/lib/patchbox: the queue lives and goes with the job records. The cluster
# is made at the first start with the password the container is given (POSTGRES_PASSWORD);
# the server listens on the compose network with password authentication only.
#
# BASE_IMAGE: a Debian image whose apt sources reach a mirror. Where no image can be
# pulled, the base `patchbox image build` made locally (`docker images patchbox-base`).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG PATCHBOX_UID=10002
ARG PATCHBOX_GID=10002
USER root
# postgresql-common first, told not to make the package's own cluster: the entry point
# makes one in the volume.
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends postgresql-common; \
    sed -ri 's/#? *(create_main_cluster) .*$/\1 = false/' /etc/postgresql-common/createcluster.conf; \
    apt-get install -y --no-install-recommends postgresql; \
    rm -rf /var/lib/apt/lists/*; \
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1); \
    ln -s "$bin" /usr/local/lib/postgresql-bin

# initdb needs the user to have a name. The state volume's folder as in the controller's
# image: whichever container mounts the new volume first gives it its owner.
RUN set -eu; \
    grep -q '^patchbox:' /etc/group || echo "patchbox:x:${PATCHBOX_GID}:" >> /etc/group; \
    grep -q '^patchbox:' /etc/passwd || echo \
        "patchbox:x:${PATCHBOX_UID}:${PATCHBOX_GID}:patchbox:/var/lib/patchbox:/usr/sbin/nologin" \
        >> /etc/passwd; \
    install -d -o "${PATCHBOX_UID}" -g "${PATCHBOX_GID}" -m 0700 /var/lib/patchbox

COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
RUN chmod 0755 /usr/local/bin/postgres-entrypoint

ENV PATH=/usr/local/lib/postgresql-bin:$PATH \
    PGDATA=/var/lib/patchbox/postgres
USER ${PATCHBOX_UID}:${PATCHBOX_GID}
WORKDIR /var/lib/patchbox
VOLUME /var/lib/patchbox
EXPOSE 5432

HEALTHCHECK --interval=2s --timeout=5s --start-period=60s --retries=30 \
    CMD ["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]

ENTRYPOINT ["postgres-entrypoint"]
