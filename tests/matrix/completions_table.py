"""`POST /v1/completions` (legacy): what the openai SDK and vLLM clients send together.

`logprobs: 0` (the chosen token's logprob, no alternatives) is a level of its own (issue 28).
Rules (docs/http.md): `echo`, `suffix` and a non-empty `logit_bias` are unsupported (400 naming
them); `best_of` must equal `n`; `stream_options` only with `stream`; a prompt is a string, token
ids, or a one-element array of either (batches are refused: one prompt per request).
"""

from __future__ import annotations

from services.common.sampling_fields import FIELDS
from tests.matrix.covering import ABSENT, Factor, Row
from tests.matrix.table import OK, Expect, Table, assigned, present, refused

PROMPTS = {
    "text": {"prompt": "The capital of France is"},
    "ids": {"prompt": [504, 3575, 282, 4649, 314]},
    "one_text": {"prompt": ["Once upon a time"]},
    "one_ids": {"prompt": [[504, 3575, 282]]},
    "unicode": {"prompt": "Café, 東京 and 🙂:"},
    # negatives
    "batch": {"prompt": ["one", "two"]},
    "out_of_vocab": {"prompt": [5, 10**9]},
}

FACTORS = (
    Factor("stream", (False, True)),
    Factor("n", (1, 2, 3)),
    Factor("logprobs", (ABSENT, 0, 1, 5)),
    Factor("echo", (ABSENT, False)),
    Factor("best_of", (ABSENT, "n")),  # "n": the row's own n
    Factor("prompt", tuple(k for k in PROMPTS if k not in ("batch", "out_of_vocab"))),
    Factor("stop", (ABSENT, "\n", [".", ","])),
    Factor("seed", (ABSENT, 7)),
    Factor("temperature", (ABSENT, 0.0, 1.0)),
    Factor("stream_options", (ABSENT, {"include_usage": True})),
    Factor("budget", (ABSENT, {"max_tokens": 1}, {"max_tokens": 4})),  # absent: OpenAI's default 16
    Factor("extras", (ABSENT, {"top_k": -1}, {"top_k": 5, "min_p": 0.1}, {"repetition_penalty": 1.2},
                      {"ignore_eos": True, "stop_token_ids": [2]})),
)


def allowed(row: Row) -> bool:
    return not (assigned(row, "stream_options", "stream") and present(row, "stream_options") and not row["stream"])


def expect(row: Row) -> Expect:
    for name in ("echo", "suffix"):
        if row.get(name, ABSENT) not in (ABSENT, False, None, ""):
            return refused(name)
    if row.get("logit_bias", ABSENT) not in (ABSENT, {}):
        return refused("logit_bias")
    logprobs = row.get("logprobs", ABSENT)
    if logprobs is not ABSENT and not FIELDS["logprobs"].bounds.low <= logprobs <= FIELDS["logprobs"].bounds.high:
        return refused("logprobs")
    if row["prompt"] == "batch":
        return refused("prompt")
    if row["prompt"] == "out_of_vocab":
        return refused("prompt[1]")
    best_of = row.get("best_of", ABSENT)
    if best_of not in (ABSENT, "n") and best_of != row["n"]:
        return refused("best_of")
    return OK


NEGATIVES = (
    ({"echo": True}, "echo"),
    ({"suffix": " the end."}, "suffix"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"best_of": 5}, "best_of"),
    ({"logprobs": FIELDS["logprobs"].bounds.high + 1}, "logprobs"),
    ({"prompt": "batch"}, "prompt"),
    ({"prompt": "out_of_vocab"}, "prompt[1]"),
)


class _CompletionsTable(Table):
    def body(self, row, context):
        out = super().body(row, context)
        if out.get("best_of") == "n":
            out["best_of"] = row["n"]
        return out


TABLE = _CompletionsTable(surface="completions", path="/v1/completions", factors=FACTORS, allowed=allowed,
              constrained=frozenset({"stream", "stream_options"}),
                          expect=expect, negatives=NEGATIVES, fragments=frozenset({"budget", "extras"}),
                          lookups={"prompt": PROMPTS}, base={"model": "default"})
