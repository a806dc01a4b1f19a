# redis-server (Debian 12's package) on the locally built base. Data and the append-only file
# live in /data (a volume). No password: run it only on a private network.
ARG REDIS_BASE=rsc-redis-base:bookworm
FROM ${REDIS_BASE}
RUN install -d -o redis -g redis -m 0750 /data
VOLUME /data
WORKDIR /data
USER redis
EXPOSE 6379
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/redis-server"]
CMD ["--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data", "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
