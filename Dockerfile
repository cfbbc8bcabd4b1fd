# The image deploy/kubernetes/ runs: `peregrine` on Debian, with Python's pip for
# `peregrine fetch` (the default model comes from PyPI).
#
#   docker build -t peregrine:cpu .
#   docker build -t peregrine:cuda --build-arg FEATURES=cuda --build-arg BASE=nvidia/cuda:13.0.0-devel-ubuntu24.04 .
#
# The CUDA build needs no toolkit: cudarc loads the driver, cuBLAS and NVRTC at run time.
# Its image does: NVRTC and the toolkit's headers (the `devel` image has both; kernels are
# compiled for the device at start-up and cached), and the driver from the host (the
# NVIDIA container toolkit). CI checks the manifests but builds no image.
ARG BASE=debian:bookworm-slim

FROM rust:1-bookworm AS build
ARG FEATURES=
WORKDIR /src
COPY . .
RUN cargo build --release --bin peregrine ${FEATURES:+--features "$FEATURES"}

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/peregrine /usr/local/bin/peregrine
ENV PEREGRINE_CACHE=/models
EXPOSE 8000
ENTRYPOINT ["peregrine"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
