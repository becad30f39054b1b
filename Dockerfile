# One image of the product alone (no local harness), both entrypoints: `skyscan-operator` and `skyscan-shim serve` (manifests/ picks one each).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY skyscan/ skyscan/
COPY operator/ operator/
COPY api_shim/ api_shim/
COPY skyscan_client/ skyscan_client/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin skyscan
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001
EXPOSE 8080 8081
CMD ["skyscan-shim", "serve"]
