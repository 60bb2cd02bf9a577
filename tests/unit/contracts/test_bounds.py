"""Declared bounds: every field of the public and internal contracts has one, they are enforced
counts first, they read back for other validators, and the vendored rules file matches the
runtime that evaluates them."""

import ast
import pathlib

import protovalidate
import pytest
from buf.validate import validate_pb2
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from services.common import contract, errors
from services.common.server import DEFAULT_MAX_MESSAGE_BYTES

# Fields whose every value is valid, so they carry no rule (and why).
UNBOUNDED = {
    "mstar.v1.SamplingParams.seed": "any int64 is a seed",
}


def _messages():
    for module in (pb, api, gen_pb2):
        pending = list(module.DESCRIPTOR.message_types_by_name.values())
        while pending:
            message = pending.pop()
            pending += message.nested_types
            if not message.GetOptions().map_entry:
                yield message


def _rules(fd: FieldDescriptor):
    options = fd.GetOptions()
    return options.Extensions[validate_pb2.field] if options.HasExtension(validate_pb2.field) else None


def test_every_field_of_both_contracts_declares_its_bounds():
    missing = []
    for message in _messages():
        for fd in message.fields:
            name = f"{message.full_name}.{fd.name}"
            if name in UNBOUNDED or fd.type == FieldDescriptor.TYPE_BOOL:
                continue
            if fd.type == FieldDescriptor.TYPE_MESSAGE and not fd.is_repeated \
                    and fd.message_type.full_name != "google.protobuf.Struct":
                continue  # a singular message: its own fields carry the rules
            rules = _rules(fd)
            kind = rules.WhichOneof("type") if rules is not None else None
            if rules is None:
                missing.append(name)
            elif fd.is_repeated and kind not in ("repeated", "map"):
                missing.append(f"{name} (no count)")
            elif kind == "string" and not (rules.string.HasField("max_len") or rules.string.HasField("max_bytes")):
                missing.append(f"{name} (no length)")
    assert not missing, missing


def test_sampling_bounds_read_back_from_the_descriptor():
    # The one source of truth for sampling ranges (issue 14 builds its field table on this).
    temperature = contract.bounds(pb.SamplingParams, "temperature")
    assert (temperature.low, temperature.high, temperature.finite) == (0.0, 2.0, True)
    assert temperature.describe() == "[0, 2]"
    top_p = contract.bounds(pb.SamplingParams, "top_p")
    assert top_p.describe() == "(0, 1]" and not top_p.contains(0.0) and top_p.contains(1.0)
    assert not top_p.contains(float("nan")) and not temperature.contains(float("inf"))
    stop = contract.bounds(pb.SamplingParams, "stop")
    assert stop.max_items == 16 and stop.items.min_len == 1 and stop.items.max_len == 256
    assert contract.bounds(pb.PreprocessInput, "request_id").pattern == "^[A-Za-z0-9._~-]*$"
    assert contract.bounds(pb.SamplingParams, "seed") == contract.Bounds()


def test_violations_name_the_field_and_never_the_value():
    request = api.GenerateRequest(input=pb.PreprocessInput(request_id="a b", model="m" * 300))
    request.input.model_kwargs.sampling.stop.extend(["", "ok"])
    request.input.model_kwargs.sampling.temperature = 3.0
    with pytest.raises(errors.MstarError) as info:
        contract.check(request)
    err = info.value
    assert err.code == errors.Code.INVALID_ARGUMENT and err.reason == "INVALID_FIELD"
    fields = [v.field for v in err.field_violations]
    assert fields == ["input.request_id", "input.model", "input.model_kwargs.sampling.temperature",
                      "input.model_kwargs.sampling.stop[0]"]
    assert "mmmm" not in err.message and "a b" not in err.message


def test_counts_are_checked_before_any_per_element_work(monkeypatch):
    # Issue 13, finding 2: 100k prompt parts were turned into objects before any cap applied.
    # An over-long list is refused from its length alone: the per-element validator never runs.
    class Refuse:
        def collect_violations(self, msg):
            raise AssertionError("per-element validation ran on an over-long list")

    monkeypatch.setattr(contract, "_validator", Refuse())
    request = api.GenerateRequest(input=pb.PreprocessInput(prompt_parts=[pb.PromptPart(text="a")] * 100_000))
    with pytest.raises(errors.MstarError) as info:
        contract.check(request, cost=lambda _: pytest.fail("the cost check ran after a count violation"))
    assert [v.field for v in info.value.field_violations] == ["input.prompt_parts"]
    with pytest.raises(errors.MstarError) as info:
        contract.check(pb.PreprocessInput(messages=[pb.ChatMessage(role="user")] * 5000))
    assert info.value.field_violations[0].field == "messages"


def test_the_cost_check_runs_before_the_validator(monkeypatch):
    calls = []
    monkeypatch.setattr(contract, "_validator", type("V", (), {
        "collect_violations": lambda self, msg: calls.append("validate") or []})())
    contract.check(pb.PreprocessInput(text="hi"), cost=lambda msg: calls.append("cost"))
    assert calls == ["cost", "validate"]


def test_a_struct_is_bounded_too():
    kwargs = pb.ModelKwargs()
    kwargs.extra.update({f"k{i}": i for i in range(17)})
    with pytest.raises(errors.MstarError) as info:
        contract.check(kwargs)
    assert info.value.field_violations[0].field == "extra"


def test_the_worst_engine_step_frame_fits_the_message_limit():
    # Issue 13, finding 1: every step frame repeats the id of every running row; with unbounded
    # ids a few multi-MB ids pushed it past 16 MB and broke the stream shared by all clients.
    # Built at the declared maxima (ids, rows, logprobs), the frame still fits with room to spare.
    rows = contract.bounds(gen_pb2.ResultTokens, "request_ids").max_items
    id_len = contract.bounds(gen_pb2.Abort, "request_id").max_len
    top = contract.bounds(pb.TokenLogprobs, "top_token_ids").max_items
    frame = gen_pb2.ResultTokens(
        step=2**62, request_ids=["i" * id_len] * rows, token_ids=[2**31 - 1] * rows, loop_indices=[2**31 - 1] * rows,
        signal=gen_pb2.SIGNAL_STEP,
        logprobs=[pb.TokenLogprobs(logprob=-1.0, top_token_ids=[2**31 - 1] * top, top_logprobs=[-1.0] * top)] * rows,
    )
    response = gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(result_tokens=frame)])
    assert response.ByteSize() < DEFAULT_MAX_MESSAGE_BYTES // 4, response.ByteSize()
    assert not protovalidate.collect_violations(frame)


def _embedded_validate_descriptor() -> descriptor_pb2.FileDescriptorProto:
    source = pathlib.Path(protovalidate.__file__).parent / "_gen" / "buf" / "validate" / "validate_pb.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "file_desc":
            return descriptor_pb2.FileDescriptorProto.FromString(node.args[0].value)
    raise AssertionError("no embedded descriptor in protovalidate")


def _comparable(fd: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto.FromString(fd.SerializeToString())
    fd.ClearField("options")  # generator-chosen package names (java, objc, php) differ
    fd.ClearField("source_code_info")
    pending = list(fd.message_type)
    for ext in fd.extension:
        ext.ClearField("json_name")
    while pending:
        message = pending.pop()
        pending += message.nested_type
        for field in [*message.field, *message.extension]:
            field.ClearField("json_name")
    return fd


def test_the_vendored_validate_proto_is_the_runtime_s():
    # third_party/protovalidate/README.md: the rules we annotate with are the ones the installed
    # protovalidate evaluates. An upgrade of either side that drifts fails here.
    ours = descriptor_pb2.FileDescriptorProto()
    validate_pb2.DESCRIPTOR.CopyToProto(ours)
    assert _comparable(ours) == _comparable(_embedded_validate_descriptor())


def _max_items(body, name: str) -> int:
    for meta in body.model_fields[name].annotation.__args__[0].__metadata__:
        for rule in getattr(meta, "metadata", ()):
            if hasattr(rule, "max_length"):
                return rule.max_length
    raise AssertionError(f"{body.__name__}.{name} has no max_length")


def test_the_copies_of_declared_bounds_are_the_contract_s():
    """Bounds the surfaces' bodies and the pure modules (which cannot read descriptors) state are
    the contract's: a request's tools are ToolCallFormat tags, an error's message a RequestFailed's."""
    from services.common import structured_output
    from services.preprocess.surfaces.anthropic.body import MessagesBody
    from services.preprocess.surfaces.openai.body import ChatBody
    from services.preprocess.surfaces.responses.body import ResponsesBody

    tags = contract.bounds(pb.ToolCallFormat, "tags").max_items
    assert [_max_items(body, "tools") for body in (ChatBody, MessagesBody, ResponsesBody)] == [tags] * 3
    assert structured_output.MAX_TOOLS == tags
    assert errors.MAX_MESSAGE_CHARS == contract.bounds(pb.RequestFailed, "message").max_len
