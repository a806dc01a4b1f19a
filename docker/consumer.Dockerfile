# sample-consumer (SPEC §8) on the locally built Debian base. The entrypoint sets POD_IP from
# the container's address when it is not given (Kubernetes passes it from the downward API).
ARG BASE=rsc-base:bookworm
FROM ${BASE}
COPY sample-consumer /usr/local/bin/sample-consumer
COPY pod-entrypoint.sh /usr/local/bin/pod-entrypoint
USER 10001:10001
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/pod-entrypoint", "/usr/local/bin/sample-consumer"]
