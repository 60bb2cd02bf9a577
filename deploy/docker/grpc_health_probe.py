"""`python /app/grpc_health_probe.py HOST:PORT [SERVICE]`: exit 0 iff grpc.health reports SERVING.

Standalone (grpcio + grpcio-health-checking only) for container HEALTHCHECKs, where grpcurl is
not installed. Kubernetes uses its native gRPC probes instead (deploy/k8s).
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with grpc.insecure_channel(argv[0]) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=argv[1] if len(argv) > 1 else ""), timeout=2.0)
    except grpc.RpcError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
