# The items service. Build from the repository root:
#   docker build -t items-service .
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p items-service

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home-dir /data --create-home items
COPY --from=build /src/target/release/items-service /usr/local/bin/items-service
USER items
WORKDIR /data
ENV BIND_ADDR=0.0.0.0:3000 \
    ADMIN_ADDR=0.0.0.0:3001 \
    RUST_LOG=info
EXPOSE 3000 3001
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/items-service"]
