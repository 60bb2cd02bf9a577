"""How the generation backend computes reaches ListModels (protobuf) and GET /v1/models (JSON) as
exactly Model.numerics' fields: whatever else the Stream's metadata holds is not reported."""

import json

from services.preprocess import wire

SENT = {"device": "cpu", "weights": "Q4_1 codes x210, Q8_0 codes x1", "activations": "float32", "kernels": "cpu",
        "kv_cache": "bfloat16", "compiled_decode": True}


def test_the_streams_metadata_becomes_model_numerics():
    metadata = (("other", "x"), (wire.NUMERICS_KEY, json.dumps({**SENT, "secret": "not for clients"})))
    numerics = wire.numerics_of(metadata)
    assert numerics == SENT  # the extra key is dropped
    message = wire.model_numerics(numerics)
    assert (message.device, message.weights, message.activations, message.kernels, message.kv_cache,
            message.compiled_decode) == ("cpu", SENT["weights"], "float32", "cpu", "bfloat16", True)


def test_missing_or_malformed_metadata_reports_nothing():
    assert wire.numerics_of(()) == {} and wire.numerics_of(None) == {}
    assert wire.numerics_of(((wire.NUMERICS_KEY, "{not json"),)) == {}
    assert wire.numerics_of(((wire.NUMERICS_KEY, "[1, 2]"),)) == {}
    assert wire.model_numerics({}) is None
    partial = wire.numerics_of(((wire.NUMERICS_KEY, json.dumps({"device": "cuda", "compiled_decode": 1})),))
    assert partial == {"device": "cuda", "weights": "", "activations": "", "kernels": "", "kv_cache": "",
                       "compiled_decode": True}
