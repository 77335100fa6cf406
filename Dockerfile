# The credbroker image that deploy/kubernetes.yaml runs: the binary at
# /usr/local/bin/credbroker, stripped, as numeric user 1000:1000 (the
# manifest's runAsUser/runAsGroup), on a distroless base with glibc and no
# shell (the readiness probe runs the binary itself, never `sh -c`).
#
# No image can be built on the machines this project is developed and
# tested on (no container runtime). scripts/check-image assembles the
# runtime layout this file describes as a directory (the stripped binary, its
# shared libraries, the numeric user, no /bin/sh) and runs the binary in it
# with chroot and setpriv, as CI does.

# Build stage: the toolchain of Cargo.toml's rust-version, the locked
# dependencies, a release build stripped of its symbols.
FROM rust:1.88-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin credbroker \
 && strip --strip-all target/release/credbroker

# Runtime stage: glibc and libgcc (the binary's only shared libraries), CA
# certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12
COPY --from=build /src/target/release/credbroker /usr/local/bin/credbroker
USER 1000:1000
# A fixed malloc mmap threshold: glibc otherwise raises it after the first
# argon2id hash (19 MiB) and keeps about 20 MiB of heap resident
# (docs/PERFORMANCE.md, "Memory").
ENV MALLOC_MMAP_THRESHOLD_=131072
ENTRYPOINT ["/usr/local/bin/credbroker"]
CMD ["--help"]
