# rsc-bridge (docs/BRIDGE.md) on the locally built Debian base: the sidecar of an application
# in any language (docker/k8s/bridge-sidecar.yaml).
ARG BASE=rsc-base:bookworm
FROM ${BASE}
COPY rsc-bridge /usr/local/bin/rsc-bridge
USER 10001:10001
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/rsc-bridge"]
