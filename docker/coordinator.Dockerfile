# rsc-coordinator on the locally built Debian base (docker/build.sh makes the base with
# debootstrap and copies the host-built binary into this build context; nothing is pulled).
ARG BASE=rsc-base:bookworm
FROM ${BASE}
COPY rsc-coordinator /usr/local/bin/rsc-coordinator
USER 10001:10001
# Every `serve` flag is also an RSC_* variable (SPEC §8). Inside a container it listens on all
# interfaces; without an ACL file that also needs --allow-anonymous (RSC_ALLOW_ANONYMOUS).
ENV RSC_LISTEN=0.0.0.0:7070 \
    RSC_LOG_FORMAT=json
EXPOSE 7070
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/rsc-coordinator"]
CMD ["serve"]
