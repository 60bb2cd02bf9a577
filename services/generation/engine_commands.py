"""The engine's commands: what other threads ask of it (add, append, abort, fail_all, a compiled
grammar), queued, then applied on the loop thread before its next step, so the scheduler and the
block manager are only ever touched by one thread.

Applying "add" is admission: a request is refused (it fails alone, before it holds anything) for
a duplicate key, a serving state that takes no work, invalid sampling or embedding parameters, a
structured-output constraint that cannot be served, or a prompt that cannot fit
(request_checks.py); otherwise it joins the scheduler.
"""

from __future__ import annotations

import queue
import random
from collections.abc import Hashable
from concurrent.futures import Future

from services.common import errors
from services.common.finish import FinishReason
from services.common.serving import ServingState
from services.generation.block_manager import BlockManager
from services.generation.grammar.requests import GrammarRequests
from services.generation.image_inputs import locate_images
from services.generation.outputs import Failure, StepOutput
from services.generation.request_checks import check_input_end, check_prompt_tokens
from services.generation.request_endings import RequestEndings
from services.generation.sampling_params import SamplingParams, validate_embedding, validate_sampling_params
from services.generation.scheduler import Scheduler
from services.generation.sequence import Sequence, Timing
from services.generation.stats import EngineStats


class EngineCommands:
    def __init__(self, seqs: dict[Hashable, Sequence], scheduler: Scheduler, block_manager: BlockManager,
                 runner, grammars: GrammarRequests, serving: ServingState, stats: EngineStats,
                 endings: RequestEndings):
        """seqs: the engine's in-flight requests by key (an admitted request joins it here);
        runner: vocab_size, hidden_size, max_model_len (what admission checks against)."""
        self.seqs = seqs
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.runner = runner
        self.serving = serving
        self.stats = stats
        self.endings = endings
        self.grammars = grammars
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._next_seq_id = 0

    # -- any thread -------------------------------------------------------------------------------

    def put(self, *command) -> None:
        self._queue.put(command)

    def empty(self) -> bool:
        return self._queue.empty()

    # -- loop thread ------------------------------------------------------------------------------

    def apply(self, out: StepOutput, wait_s: float) -> None:
        """Apply every queued command, waiting up to wait_s for the first one."""
        try:
            command = self._queue.get(timeout=wait_s) if wait_s else self._queue.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, *args = command
            if kind == "add":
                self._add(out, *args)
            elif kind == "append":
                self._append(out, *args)
            elif kind == "abort":
                self._abort(out, *args)
            elif kind == "grammar":
                self._grammar_ready(out, *args)
            elif kind == "fail_all":
                for seq in list(self.seqs.values()):
                    self.endings.fail(out, seq, args[0])
            try:
                command = self._queue.get_nowait()
            except queue.Empty:
                return

    def _reject(self, out: StepOutput, key: Hashable, error: errors.MstarError) -> None:
        self.stats.num_rejections += 1
        out.failed.append(Failure(key, error))

    def _add(self, out, key, token_ids, params: SamplingParams, input_done: bool, arrival: float,
             images: list | None = None) -> None:
        if key in self.seqs:
            # The running request keeps going; the duplicate alone is refused.
            out.failed.append(Failure(key, errors.already_exists("a request with this id is already running")))
            return
        if not self.serving.accepts_work:
            self._reject(out, key, self.serving.refusal())
            return
        message = validate_sampling_params(params, self.runner.vocab_size)
        error = errors.invalid_argument("sampling", message) if message else None
        message = None if error else validate_embedding(params, self.runner.hidden_size)
        error = error or (errors.invalid_argument("embedding", message) if message else None)
        error = error or self.grammars.check(params)
        error = error or check_prompt_tokens(token_ids, len(token_ids), self.runner, self.block_manager,
                                             output_tokens=0 if params.embedding is not None else 1)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(key, self._next_seq_id, token_ids, params, seed, Timing(arrival, arrival), input_done)
        if error is None and images:
            error = self._attach_images(seq, images, input_done)
        if error is None and input_done:
            error = check_input_end(seq, self.runner, self.block_manager)
        if error is None and params.structured_output is not None:
            error = self.grammars.start(seq)
        if error is not None:
            self._reject(out, key, error)
            return
        self._next_seq_id += 1
        self.seqs[key] = seq
        self.scheduler.add(seq)

    def _attach_images(self, seq: Sequence, images: list, input_done: bool) -> errors.MstarError | None:
        tokens_per_tile = getattr(self.runner, "tokens_per_tile", None)
        if tokens_per_tile is None:
            return errors.invalid_argument("images", "this model takes text only, not images")
        if not input_done:
            return errors.invalid_argument("images", "a prompt with images must be complete in its first frame")
        located = locate_images(seq.token_ids, images, self.runner.image_token_id, tokens_per_tile)
        if isinstance(located, str):
            return errors.invalid_argument("images", located)
        seq.images = located
        return None

    def _grammar_ready(self, out: StepOutput, key: Hashable, seq_id: int, future: Future) -> None:
        seq = self.seqs.get(key)
        if seq is None or seq.seq_id != seq_id:
            return  # aborted or failed meanwhile (the key may even be reused by a newer request)
        error = self.grammars.attach(seq, future)
        if error is not None:
            self.endings.fail(out, seq, error)

    def _append(self, out, key, token_ids, input_done: bool, when: float, max_tokens: int | None) -> None:
        seq = self.seqs.get(key)
        if seq is None:
            return  # finished or aborted meanwhile: nothing to add to
        if seq.is_input_done:
            self.endings.fail(out, seq, errors.failed_precondition("its input already ended", "INPUT_ENDED"))
            return
        error = check_prompt_tokens(token_ids, seq.num_prompt_tokens + len(token_ids), self.runner, self.block_manager,
                                    output_tokens=0 if seq.is_embedding else 1)
        if error is None:
            seq.append_prompt(token_ids)
            if input_done:
                seq.is_input_done = True
                seq.timing.ingest = when
                if max_tokens is not None:
                    seq.params.max_tokens = max_tokens
                error = check_input_end(seq, self.runner, self.block_manager)
        if error is not None:
            self.endings.fail(out, seq, error)

    def _abort(self, out: StepOutput, key: Hashable) -> None:
        seq = self.seqs.get(key)
        if seq is not None:
            self.endings.finish(out, seq, FinishReason.CANCELLED)
