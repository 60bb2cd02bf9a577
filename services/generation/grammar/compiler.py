"""Compile structured-output constraints with xgrammar, off the engine loop, cached by content.

``submit`` never blocks: it returns a Future that is already done on a cache hit, is shared with
an identical compile in flight, or is completed by the one compile worker thread. The engine
keeps stepping the rest of the batch meanwhile. A constraint that does not compile fails with
INVALID_ARGUMENT (reason INVALID_GRAMMAR) naming the part and xgrammar's reason; failures are
cached too, so resending a broken schema costs nothing. The cache is a bounded LRU (entries and
bytes of compiled token-mask tables); xgrammar's own unbounded cache is off.

The xgrammar TokenizerInfo (the vocabulary decoded to bytes, ~0.1 s for 49k tokens) is built on
the worker thread by the first compile, so an engine that never sees a constraint never pays it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from services.common import errors
from services.common.structured_output import (
    CHOICE,
    FIELD,
    GRAMMAR,
    JSON_OBJECT,
    JSON_SCHEMA,
    REGEX,
    TOOL_CALLS,
    StructuredOutput,
)
from services.generation.grammar.cache import LruCache
from services.generation.grammar.json_schema import safe_json_grammar
from services.generation.grammar.xgr import xgrammar
from services.generation.weights.vocabulary import Vocabulary

log = logging.getLogger(__name__)

_FIELD_OF_KIND = {JSON_SCHEMA: "json_schema", JSON_OBJECT: "kind", REGEX: "regex", GRAMMAR: "grammar",
                  CHOICE: "choices", TOOL_CALLS: "tool_calls"}
# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: " and "Check failed: ... : ".
_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")
# Whitespace a tool call's JSON arguments may hold between two tokens of JSON: enough for ", "
# and ": ", too little for a small model to loop on blanks.
_TOOL_ARGUMENT_WHITESPACE = 1
_COMPILED_ERROR_BYTES = 1024  # what a cached compile failure counts against the byte bound


@dataclass
class GrammarConfig:
    cache_entries: int = 256
    cache_bytes: int = 256 * 2**20  # compiled grammars hold token-mask tables (~40 KB-MBs each)
    compile_threads: int = 1  # xgrammar's threads inside one compile; 1 leaves the other core to the step


class GrammarCompiler:
    def __init__(self, vocabulary: Vocabulary, vocab_size: int, stop_token_ids, config: GrammarConfig | None = None):
        """vocab_size: the model's logits width (may exceed the vocabulary: padded ids are masked)."""
        if len(vocabulary) > vocab_size:
            raise ValueError(f"the vocabulary has {len(vocabulary)} tokens but the model only {vocab_size} logits")
        self.vocabulary = vocabulary
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.config = config or GrammarConfig()
        self.cache = LruCache(self.config.cache_entries, self.config.cache_bytes)
        self.num_compiles = 0
        self._in_flight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._xgr_compiler = None  # built on the worker thread

    def submit(self, constraint: StructuredOutput) -> Future:
        """Future of the compiled grammar (xgrammar.CompiledGrammar) or of an MstarError."""
        key = constraint.cache_key
        with self._lock:
            cached = self.cache.get(key)
            if cached is not None:
                return _done(cached)
            future = self._in_flight.get(key)
            if future is None:
                future = self._executor.submit(self._compile, key, constraint)
                self._in_flight[key] = future
            return future

    def warm_up(self) -> Future:
        """Import xgrammar and build its TokenizerInfo on the compile thread now (~1-2 s the first
        time in a process), so the first structured request does not wait for them."""
        return self._executor.submit(self._compiler)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    # -- worker thread --------------------------------------------------------------------------

    def _compile(self, key: str, constraint: StructuredOutput):
        start = time.perf_counter()
        try:
            result = self._compile_one(constraint)
            size = result.memory_size_bytes
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's errors are RuntimeError subclasses
            field = f"{FIELD}.{_failing_part(constraint)}"
            result = errors.invalid_argument(field, f"does not compile: {_clean(e)}", "INVALID_GRAMMAR")
            size = _COMPILED_ERROR_BYTES
        seconds = time.perf_counter() - start
        with self._lock:
            self.num_compiles += 1
            self.cache.put(key, result, size)
            del self._in_flight[key]
        log.debug("grammar compiled", extra={"kind": constraint.kind, "ms": round(seconds * 1000, 1),
                                             "ok": not isinstance(result, errors.MstarError)})
        if isinstance(result, errors.MstarError):
            raise replace(result)
        return result

    def _compile_one(self, c: StructuredOutput):
        xgr = xgrammar()
        compiler = self._compiler()
        if c.kind == JSON_SCHEMA:
            grammar = xgr.Grammar.from_json_schema(c.json_schema, any_whitespace=False, strict_mode=True)
        elif c.kind == JSON_OBJECT:
            grammar = xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        elif c.kind == TOOL_CALLS:
            grammar = xgr.Grammar.from_structural_tag(json.dumps(_structural_tag(c)))
        elif c.kind == REGEX:
            return compiler.compile_regex(c.regex)
        elif c.kind == GRAMMAR:
            return compiler.compile_grammar(c.grammar)
        else:  # CHOICE: EBNF string literals take JSON's escapes (quotes, backslashes, newlines, unicode escapes)
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in c.choices))
        return compiler.compile_grammar(safe_json_grammar(grammar))

    def _compiler(self):
        if self._xgr_compiler is None:
            xgr = xgrammar()
            v = self.vocabulary
            kind = {"byte_level": xgr.VocabType.BYTE_LEVEL, "byte_fallback": xgr.VocabType.BYTE_FALLBACK,
                    "raw": xgr.VocabType.RAW}[v.encoding]
            # Control tokens must never be text: xgrammar treats an empty spelling as special.
            spelled = ["" if i in v.control_token_ids else t for i, t in enumerate(v.tokens)]
            info = xgr.TokenizerInfo(spelled, kind, vocab_size=self.vocab_size,
                                     stop_token_ids=list(self.stop_token_ids), add_prefix_space=v.add_prefix_space)
            self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=self.config.compile_threads,
                                                     cache_enabled=False)
        return self._xgr_compiler


def _failing_part(c: StructuredOutput) -> str:
    """The part of a constraint that does not compile: for tool calls, the first tool whose
    argument schema fails alone (so the surface can name that tool), else the whole kind."""
    if c.kind == TOOL_CALLS:
        xgr = xgrammar()
        for i, tag in enumerate(c.tool_calls.tags):
            try:
                xgr.Grammar.from_json_schema(tag.json_schema, any_whitespace=False, strict_mode=True)
            except (RuntimeError, ValueError, TypeError):
                return f"tool_calls.tags[{i}].json_schema"
    return _FIELD_OF_KIND[c.kind]


def _structural_tag(c: StructuredOutput) -> dict:
    calls = c.tool_calls
    tags = [
        {"type": "tag", "begin": t.begin, "end": t.end,
         "content": {"type": "json_schema", "json_schema": json.loads(t.json_schema),
                     "max_whitespace_cnt": _TOOL_ARGUMENT_WHITESPACE}}
        for t in calls.tags
    ]
    if calls.require_call:  # calls only: no text before, between or after them
        form = {"type": "tags_with_separator", "tags": tags, "separator": calls.separator, "at_least_one": True}
    else:  # text until a trigger, then that call, then text again
        form = {"type": "triggered_tags", "triggers": list(calls.triggers), "tags": tags, "at_least_one": False}
    return {"type": "structural_tag", "format": form | {"stop_after_first": not calls.parallel}}


def _clean(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _NOISE.sub("", _NOISE.sub("", text)).strip()


def _done(result) -> Future:
    future: Future = Future()
    if isinstance(result, errors.MstarError):
        future.set_exception(replace(result))
    else:
        future.set_result(result)
    return future
