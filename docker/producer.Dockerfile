# sample-producer (SPEC §8) on the locally built Debian base: a one-shot job.
ARG BASE=rsc-base:bookworm
FROM ${BASE}
COPY sample-producer /usr/local/bin/sample-producer
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/sample-producer"]
