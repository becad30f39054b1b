# One image of the product alone (no local harness), both entrypoints: `skyscan-operator` and `skyscan-shim serve` (manifests/ picks one each).
# BASE: any Debian-like image with Python 3.11 and its venv module: python:3.11-slim for `docker build`,
# the Debian bookworm root filesystem `make up NODE=real` makes when no registry can be reached.
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
# Where the build reaches PyPI through a proxy with a CA of its own (the local builder mounts the host's
# bundle and names it here); empty: pip's own.
ARG PIP_CERT
WORKDIR /src
# The product's dependencies exactly as locked (`make lock`), each file checked against its hashes, in a
# layer of their own; then the product without dependencies, built by the locked setuptools.
COPY requirements/image.txt requirements/image.txt
RUN python3 -m venv /opt/skyscan \
 && /opt/skyscan/bin/pip install --no-cache-dir --require-hashes -r requirements/image.txt
COPY pyproject.toml README.md ./
COPY skyscan/ skyscan/
COPY operator/ operator/
COPY api_shim/ api_shim/
COPY skyscan_client/ skyscan_client/
RUN /opt/skyscan/bin/pip install --no-cache-dir --no-deps --no-build-isolation .

FROM ${BASE}
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin skyscan
COPY --from=build /opt/skyscan /opt/skyscan
ENV PATH=/opt/skyscan/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001
EXPOSE 8080 8081
CMD ["skyscan-shim", "serve"]
