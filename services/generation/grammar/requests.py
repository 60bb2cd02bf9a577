"""The engine's side of structured output: admit a constraint, hand it to the compiler, step the matcher.

All of it runs on the engine loop thread except compiling. A request whose grammar is not cached
yet is admitted with ``is_waiting_for_grammar`` set: it prefills but does not sample. When the
compile finishes, ``wake(key, seq_id, future)`` (called on the compile thread) queues a command,
and the loop calls ``attach`` for the request, if it is still the same one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from services.common import errors
from services.common.structured_output import ConstraintError, validate_structured_output
from services.generation.grammar.compiler import GrammarCompiler, GrammarConfig
from services.generation.grammar.matcher import SequenceGrammar
from services.generation.sampling_params import SamplingParams
from services.generation.sequence import Sequence

log = logging.getLogger(__name__)


class GrammarRequests:
    def __init__(self, runner, config: GrammarConfig, wake: Callable[[Hashable, int, Future], None]):
        """runner: vocab_size, eos_token_ids and vocabulary (None: structured output is refused)."""
        vocabulary = getattr(runner, "vocabulary", None)
        if vocabulary is not None and len(vocabulary) > runner.vocab_size:
            log.warning("structured output is off: the vocabulary has more tokens than the model has logits",
                        extra={"vocabulary": len(vocabulary), "logits": runner.vocab_size})
            vocabulary = None
        self.eos_token_ids = tuple(runner.eos_token_ids)
        self.compiler = (GrammarCompiler(vocabulary, runner.vocab_size, self.eos_token_ids, config)
                         if vocabulary is not None else None)
        self._wake = wake
        self.advance_seconds = 0.0  # cumulative time matchers spent accepting sampled tokens

    def check(self, params: SamplingParams) -> errors.MstarError | None:
        """Admission: INVALID_ARGUMENT naming the bad part, or why this server cannot constrain."""
        if params.structured_output is None:
            return None
        if self.compiler is None:
            return errors.failed_precondition(
                "structured output needs the model's vocabulary, and this model was loaded without one",
                "STRUCTURED_OUTPUT_UNAVAILABLE")
        try:
            validate_structured_output(params.structured_output)
        except ConstraintError as e:
            return errors.invalid_argument(e.field, e.description)
        return None

    def start(self, seq: Sequence) -> errors.MstarError | None:
        """Attach the compiled grammar now (cache hit) or hold seq's sampling until it compiles."""
        future = self.compiler.submit(seq.params.structured_output)
        if future.done():
            return self.attach(seq, future)
        seq.is_waiting_for_grammar = True
        key, seq_id = seq.key, seq.seq_id
        future.add_done_callback(lambda f: self._wake(key, seq_id, f))
        return None

    def attach(self, seq: Sequence, future: Future) -> errors.MstarError | None:
        """Give seq its matcher; the error that fails seq when the grammar did not compile."""
        if future.cancelled():
            return errors.unavailable("the grammar compiler stopped", "ENGINE_UNAVAILABLE")
        error = future.exception()
        if error is not None:
            return error if isinstance(error, errors.MstarError) else errors.internal(
                f"compiling the grammar failed: {type(error).__name__}: {error}", "GRAMMAR_COMPILE_FAILED")
        seq.grammar = SequenceGrammar(future.result(), (*self.eos_token_ids, *seq.params.stop_token_ids))
        seq.is_waiting_for_grammar = False
        return None

    def advance(self, seq: Sequence, token: int) -> errors.MstarError | None:
        """Move seq's matcher past its sampled token (the mask let only acceptable ones through)."""
        start = time.perf_counter()
        accepted = seq.grammar.accept(token)
        self.advance_seconds += time.perf_counter() - start
        if accepted:
            return None
        if seq.grammar.is_dead_end:
            return errors.invalid_argument(
                "structured_output",
                f"the grammar allows no token of this model's vocabulary after {seq.num_output_tokens} output tokens",
                "GRAMMAR_DEAD_END")
        return errors.internal(f"the grammar rejected sampled token {token}",
                               "GRAMMAR_REJECTED_TOKEN")

    def close(self) -> None:
        if self.compiler is not None:
            self.compiler.close()
