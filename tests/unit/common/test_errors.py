"""errors.py: codes, HTTP statuses and caps; grpc_errors.py: the one mapping to rich gRPC details."""

import grpc
from google.rpc import error_details_pb2

from services.common import errors, grpc_errors


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
    status = grpc_errors.to_rpc_status(err)
    assert status.code == 3 and err.http_status == 400
    details = _details(status)
    assert details["ErrorInfo"].reason == "BAD_TEMPERATURE"
    assert details["ErrorInfo"].domain == grpc_errors.DOMAIN
    assert details["BadRequest"].field_violations[0].field == "model_kwargs.sampling.temperature"
    assert "RetryInfo" not in details


def test_resource_exhausted_has_retry_info_and_maps_to_429():
    err = errors.resource_exhausted("queue full", "QUEUE_FULL", retry_after_s=2.5)
    details = _details(grpc_errors.to_rpc_status(err))
    assert details["RetryInfo"].retry_delay.seconds == 2 and details["RetryInfo"].retry_delay.nanos == 500_000_000
    assert err.http_status == 429
    assert grpc_errors.to_grpc_status(err).code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_http_mapping_matches_envoy():
    expected = {errors.Code.CANCELLED: 499, errors.Code.DEADLINE_EXCEEDED: 504, errors.Code.NOT_FOUND: 404,
                errors.Code.PERMISSION_DENIED: 403, errors.Code.FAILED_PRECONDITION: 400,
                errors.Code.UNAVAILABLE: 503, errors.Code.INTERNAL: 500, errors.Code.UNAUTHENTICATED: 401}
    for code, http in expected.items():
        assert errors.HTTP_STATUS[code] == http


def test_every_code_has_an_http_status():
    assert set(errors.HTTP_STATUS) == set(errors.Code)


def test_an_unset_or_unknown_failure_code_reads_as_internal_never_ok():
    # Issue 13, finding 7: a RequestFailed with code 0 used to become OK / HTTP 200.
    assert errors.from_code(0) == errors.Code.INTERNAL
    assert errors.from_code(99) == errors.Code.INTERNAL
    assert errors.from_code(3) == errors.Code.INVALID_ARGUMENT


def test_errors_never_carry_unbounded_client_input():
    # Issue 13, finding 10: a 1 MB value echoed into a status made Envoy reset the shared
    # upstream connection. Every string an error carries is capped, whatever the call site did.
    huge = "x" * 1_000_000
    err = errors.invalid_argument(huge, f"bad value {huge}")
    status = grpc_errors.to_rpc_status(err)
    assert len(status.message) <= errors.MAX_MESSAGE_CHARS
    violation = _details(status)["BadRequest"].field_violations[0]
    assert len(violation.field) <= errors.MAX_FIELD_CHARS and len(violation.description) <= errors.MAX_FIELD_CHARS
    assert all(len(v) <= errors.MAX_FIELD_CHARS for v in err.metadata.values())
    assert len(status.SerializeToString()) < 4096


def test_quote_shows_a_short_escaped_prefix_and_the_length():
    assert errors.quote("model-a") == "'model-a'"
    shown = errors.quote("a\nb\x00" + "z" * 1000 + "\ud800")
    assert "\n" not in shown and "\x00" not in shown and "1005 characters" in shown and len(shown) < 100
    assert errors.field_name("max_token") == "max_token"  # plain keys stay readable
    assert errors.field_name("k" * 500).endswith("(500 characters)")


def test_a_lone_surrogate_in_a_message_cannot_break_the_status():
    err = errors.invalid_argument("body", "bad \ud800 text")
    grpc_errors.to_rpc_status(err).SerializeToString()  # used to raise UnicodeEncodeError -> UNKNOWN
