# mstar's Envoy: the official image plus the descriptor set and the rendered configs.
# Build from the repo root: docker build -f deploy/docker/envoy.Dockerfile .
FROM python:3.11-slim AS descriptor
WORKDIR /src
# protoc and googleapis at the versions and hashes of requirements.lock (deploy/docker/locks.py).
COPY deploy/docker/requirements-protos.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock
COPY protos protos
COPY deploy/docker/gen_protos.sh /tmp/gen_protos.sh
RUN /tmp/gen_protos.sh /out

FROM envoyproxy/envoy:v1.40.0
COPY --from=descriptor /out/descriptor.pb /etc/envoy/descriptor.pb
# compose uses this config; Kubernetes mounts deploy/k8s/envoy-config.yaml from a ConfigMap.
COPY deploy/envoy/envoy.compose.yaml /etc/envoy/envoy.yaml
EXPOSE 8080
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml", "--drain-time-s", "5", "--drain-strategy", "immediate"]
