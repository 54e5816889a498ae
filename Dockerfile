# syntax=docker/dockerfile:1
# The items service. Build from the repository root:
#   docker build -t items-service .
# BuildKit cache mounts keep the registry and the compiled dependencies
# between builds, so a code change rebuilds only the workspace's crates.
# The crates' minimum Rust (rust-version in Cargo.toml).
FROM rust:1.94-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p items-service \
    && cp target/release/items-service /usr/local/bin/items-service

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home-dir /data --create-home items
COPY --from=build /usr/local/bin/items-service /usr/local/bin/items-service
USER items
WORKDIR /data
# mimalloc commits its arenas as pages are used, not ahead: a start's peak
# memory at 10M keys 58 MiB instead of 76 (docs/benchmarks.md).
ENV BIND_ADDR=0.0.0.0:3000 \
    ADMIN_ADDR=0.0.0.0:3001 \
    RUST_LOG=info \
    MIMALLOC_ARENA_EAGER_COMMIT=0
EXPOSE 3000 3001
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=12 \
    CMD curl -fsS -o /dev/null http://127.0.0.1:3000/readyz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/items-service"]
