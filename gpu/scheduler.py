"""The scheduler: which sequences run in the next step, and how many of their tokens.

Continuous batching (vLLM's v1 scheduler, simplified): there is no separate prefill phase.
Each step has a token budget. Running sequences that are decoding get their one token first,
so streams already flowing never stall; then sequences that are part-way through their prompt
get a chunk; then waiting requests are admitted first come, first served, each taking a chunk
of what budget is left (chunked prefill: a long prompt is spread over several steps instead of
freezing everyone else for one long step).

When the KV cache has no block for a running sequence, the most recently admitted sequence is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be
recomputed later (its prompt and the tokens it already generated are prefilled again, mostly
from the prefix cache).

Async scheduling (see LLMEngine.step): while a step is in flight, some sequences end in a
placeholder token (Sequence.num_pending). They are scheduled like any decode, since their
lengths already count the placeholder, with two exceptions: one whose placeholder reaches its
length limit is not scheduled (that token ends it, whatever it is), and one with a placeholder
is never preempted (recomputing it needs its real tokens): the scheduler raises DrainNeeded
instead, and the engine waits for the step in flight and schedules again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpu.block_manager import BlockManager
from gpu.sequence import Sequence, SequenceStatus


class DrainNeeded(Exception):
    """Scheduling must preempt a sequence whose last token is still in flight."""


@dataclass
class SchedulerOutput:
    """The step's work: the sequences that run, decodes first, and how many new tokens each.

    Two parallel lists, not a list of (sequence, count) pairs: the runner reads them as
    columns, and a decode step of hundreds of sequences builds no pair per sequence.
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # taken from the waiting queue

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def scheduled(self) -> list[tuple[Sequence, int]]:
        """(sequence, number of new tokens) pairs, in order."""
        return list(zip(self.seqs, self.num_new_tokens, strict=True))

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self.num_preemptions = 0
        self.protect_pending = False  # set by each schedule()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, protect_pending: bool = False) -> SchedulerOutput:
        """The next step's work. protect_pending: a step is in flight, so raise DrainNeeded
        rather than preempt a sequence holding a placeholder (blocks already given to others
        stay theirs: allocation is by need, so scheduling again reuses them)."""
        self.protect_pending = protect_pending
        out = SchedulerOutput()
        seqs, num_new_tokens = out.seqs, out.num_new_tokens
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        bs = bm.block_size
        running = SequenceStatus.RUNNING

        # 1. decodes, one token each, in one pass over the running sequences (the hot loop of
        # a decode step: most steps are only this). Sequences still prefilling are set aside.
        prefills = []
        for seq in list(self.running):  # a copy: a preemption removes from self.running
            if budget == 0:
                break
            if seq.status is not running:  # preempted earlier in this step
                continue
            if len(seq.token_ids) - seq.num_computed_tokens != 1:
                prefills.append(seq)
                continue
            if len(seq.token_ids) >= seq.length_limit:  # its token in flight is its last
                continue
            if seq.num_computed_tokens >= len(seq.block_table) * bs:  # its blocks are full
                budget += self._allocate_or_preempt(seq, 1, out)
                if seq.status is not running:
                    continue
            seqs.append(seq)
            num_new_tokens.append(1)
            budget -= 1
        out.num_decode_tokens = len(seqs)  # so far, every scheduled sequence is a decode

        # 2. prefill chunks of admitted sequences, oldest first.
        for seq in prefills:
            if budget == 0:
                break
            if seq.status is not running:
                continue
            remaining = len(seq.token_ids) - seq.num_computed_tokens
            n = remaining if remaining < budget else budget
            if seq.num_computed_tokens + n > len(seq.block_table) * bs:  # needs blocks
                budget += self._allocate_or_preempt(seq, n, out)
                if seq.status is not running:
                    continue
            out.add(seq, n)
            budget -= n
            out.num_prefill_tokens += n

        # 3. admit waiting requests while there is budget, room and memory (not after a
        # preemption: memory is short, let the running ones finish first).
        while self.waiting and budget > 0 and not out.preempted:
            if len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[0]
            cached = bm.find_cached_prefix(seq)
            n = min(seq.num_tokens - len(cached) * bm.block_size, budget)
            if not bm.admit(seq, cached, n):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.admitted.append(seq)
            out.add(seq, n)
            budget -= n
            if seq.num_tokens - seq.num_computed_tokens == 1:
                out.num_decode_tokens += n
            else:
                out.num_prefill_tokens += n
        return out

    def _allocate_or_preempt(self, seq: Sequence, n: int, out: SchedulerOutput) -> int:
        """Give seq blocks for n more tokens, preempting the newest sequences until they fit
        (seq itself last: then it is preempted too). Returns the budget the preempted give back.
        """
        reclaimed = 0
        while not self.block_manager.allocate(seq, n):
            victim = self.running[-1]
            if self.protect_pending and victim.num_pending:
                raise DrainNeeded(victim.request_id)
            reclaimed += self._preempt(victim, out)
            if victim is seq:
                break
        return reclaimed

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Recompute-style preemption: drop seq's KV and queue it first among the waiting.

        Returns the tokens it had already been given this step (back into the budget)."""
        self.running.remove(seq)
        reclaimed = 0
        for i, s in enumerate(out.seqs):
            if s is seq:  # it was already given tokens this step: take them back
                del out.seqs[i]
                reclaimed = out.num_new_tokens.pop(i)
                if seq.num_tokens - seq.num_computed_tokens == 1:
                    out.num_decode_tokens -= reclaimed
                else:
                    out.num_prefill_tokens -= reclaimed
                break
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1
        return reclaimed

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
