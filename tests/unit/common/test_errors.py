"""errors.py is the one mapping: codes, HTTP statuses and rich details."""

import grpc
from google.rpc import error_details_pb2

from services.common import errors


def _details(status):
    out = {}
    for any_msg in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            if any_msg.Is(cls.DESCRIPTOR):
                msg = cls()
                any_msg.Unpack(msg)
                out[cls.__name__] = msg
    return out


def test_invalid_argument_carries_error_info_and_field_violation():
    err = errors.invalid_argument("model_kwargs.sampling.temperature", "must be in [0, 2]", "BAD_TEMPERATURE")
    status = errors.to_rpc_status(err)
    assert status.code == 3 and err.http_status == 400
    details = _details(status)
    assert details["ErrorInfo"].reason == "BAD_TEMPERATURE"
    assert details["ErrorInfo"].domain == errors.DOMAIN
    assert details["BadRequest"].field_violations[0].field == "model_kwargs.sampling.temperature"
    assert "RetryInfo" not in details


def test_resource_exhausted_has_retry_info_and_maps_to_429():
    err = errors.resource_exhausted("queue full", "QUEUE_FULL", retry_after_s=2.5)
    details = _details(errors.to_rpc_status(err))
    assert details["RetryInfo"].retry_delay.seconds == 2 and details["RetryInfo"].retry_delay.nanos == 500_000_000
    assert err.http_status == 429
    assert errors.to_grpc_status(err).code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_http_mapping_matches_envoy():
    expected = {errors.Code.CANCELLED: 499, errors.Code.DEADLINE_EXCEEDED: 504, errors.Code.NOT_FOUND: 404,
                errors.Code.PERMISSION_DENIED: 403, errors.Code.FAILED_PRECONDITION: 400,
                errors.Code.UNAVAILABLE: 503, errors.Code.INTERNAL: 500, errors.Code.UNAUTHENTICATED: 401}
    for code, http in expected.items():
        assert errors.HTTP_STATUS[code] == http


def test_every_code_has_an_http_status():
    assert set(errors.HTTP_STATUS) == set(errors.Code)
