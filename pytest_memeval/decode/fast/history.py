"""Free-running decoding (``history="model"``): the teacher-forced stages, round after round,
over the conversation as the model has made it so far.

Free-running, the prompt of assistant message *k* holds the model's own outputs for the
earlier messages (``docs/decoding.md``, "Free-running"). While every earlier output is
byte-identical to the true message, that prompt *is* the teacher-forced prompt, so the
teacher-forced pass proves the outputs there exactly as for ``history="truth"``, up to and
including the first turn where the model leaves the truth. From there the conversation is
rebuilt with the model's outputs so far and the truth after them as the next guess
(``prompts.history_scenario``), and the same stages run again over the turns that follow:
planned (``plan.py``: the chat template's rendering of the rebuilt messages, the prefix
property checked, the reference path with a note where it fails), forward-passed
(``forward.py``), their pending turns settled by the verification pass and ``generate``;
each output is accepted in order up to the next departure (a pending turn that turns out to
be the truth, after a near tie, lets the ones after it count too); repeat until the final
answer. Every accepted output was computed on exactly the prompt the reference builds, so the
rollout is the reference's (:func:`~pytest_memeval.decode.reference.free_running_rollout`).

**From the cached prefix.** A round after the first does not run the conversation again: the
rebuilt conversation shares its first tokens with the one the scenario's last pass held (up
to the departure: the prompt and the part of the truth the model reproduced), so its keys and
values are cut out of that pass's cache, and one cached pass over the rest (the verification
pass's cut computation, ``verify.py``: left-padded cache, right-padded tokens, positions from
each row's own length) gives the logits the teacher-forced check reads, with the ``verify``
bound. Where a cache cannot be cut (sliding-window or hybrid caches) the round runs a forward
pass from the start instead; either way the prompts are the chat template's rendering of the
rebuilt messages, tokenised as the reference tokenises them: the cache is reused only for the
longest common prefix of those token ids, never for the tokens the model generated.

A round plans a window of the next turns (:data:`WINDOW`, doubled for a scenario whose window
passes without a departure) and its pass stops at the window's end: a model that leaves the
truth at most turns needs only the first of them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.history import HISTORY_MODEL, fed_back
from pytest_memeval.core.records import Rollout, TurnOutput
from pytest_memeval.decode.batches import even_batches
from pytest_memeval.decode.fast.forward import ForwardDecisions, ForwardStage, PendingTurn
from pytest_memeval.decode.fast.kvcache import CacheSlice
from pytest_memeval.decode.fast.plan import Planner, ReferenceOnly, ScenarioPlan
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.decode.fast.verify import Continuation, Verifier
from pytest_memeval.decode.reference import free_running_rollout, prompt_tail
from pytest_memeval.model.prompts import history_scenario

__all__ = ["WINDOW", "FreeRunner", "RoundStages"]

#: Turns a round plans for a scenario at first; doubled each time a scenario's window passes
#: without a departure (the forward pass of a round runs to the end of its window only).
WINDOW = 2


@dataclass(frozen=True)
class RoundStages:
    """What a free-running round runs, handed to :class:`FreeRunner` by the fast decoder
    that built the stages (``decoder.py``): the stages it calls directly, and the decoder's
    steps that hold decoder-wide state (the calibration due, exact mode, batching rules)."""

    planner: Planner
    forward: ForwardStage
    verifier: Verifier
    #: the decode path its rollouts name
    path: str
    #: most scenarios one forward pass holds (the batching rules' rows)
    rows_per_pass: int
    #: one forward pass (measured against the reference first when that is due)
    forward_batch: Callable[[list[ScenarioPlan]], ForwardDecisions]
    #: each pending turn's output: verification pass, then ``generate`` (or exact steps)
    settle_turns: Callable[[Sequence[ScenarioPlan], Sequence[PendingTurn]], list[TurnOutput]]
    #: forward passes of similar lengths (indices into the lengths given)
    batch_groups: Callable[[Sequence[int]], list[list[int]]]
    #: whether pending turns held over passes of so many padded tokens are settled now
    pool_full: Callable[[int, int], bool]


@dataclass
class _Track:
    """One scenario decoded free-running: its outputs so far, as they were fed back."""

    position: int
    scenario: Scenario
    outputs: list[TurnOutput] = field(default_factory=list)
    window: int = WINDOW
    tail: str = ""
    batch: int = 0
    #: the conversation ids its last pass held, and where that pass's cache holds them
    held_ids: Sequence[int] = ()
    held: CacheSlice | None = None

    @property
    def done(self) -> bool:
        return len(self.outputs) == len(self.scenario.assistant_indices)

    def next_turns(self) -> list[int]:
        start = len(self.outputs)
        return list(range(start, min(len(self.scenario.assistant_indices), start + self.window)))

    def reusable(self, plan: ScenarioPlan) -> int:
        """How many first tokens of ``plan``'s conversation the last pass's cache holds (the
        longest common prefix of the ids), short of the first planned prompt's last token
        (whose logits the check reads); 0: nothing to continue from."""
        if self.held is None:
            return 0
        limit = min(len(self.held_ids), len(plan.turns[0].prompt.ids) - 1)
        same = 0
        while same < limit and self.held_ids[same] == plan.full[same]:
            same += 1
        return same

    def take(self, output: TurnOutput) -> bool:
        """Accept the next turn's output; whether the model stayed on the truth there (the
        prompts of this round's later turns are then still the free-running ones)."""
        k = self.scenario.assistant_indices[len(self.outputs)]
        text = fed_back(output.text)
        self.outputs.append(TurnOutput(text, output.stopped, output.generated))
        return not self.done and text == self.scenario.messages[k]["content"]


@dataclass
class _Row:
    """A track in one forward pass: its plan, and how far the round has read it."""

    track: _Track
    plan: ScenarioPlan
    row: int
    cursor: int = 0
    stopped: bool = False


@dataclass
class _Held:
    """One forward pass of a round, held until its rows have reached their departures."""

    rows: list[_Row]
    decided: ForwardDecisions
    pending: dict[tuple[int, int], PendingTurn]
    #: the pending turns settled so far, by (row, turn)
    settled: dict[tuple[int, int], TurnOutput] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: list[_Row], decided: ForwardDecisions) -> _Held:
        return cls(rows, decided, {(p.row, p.turn_no): p for p in decided.pending})


class FreeRunner(Stage):
    """Free-running rollouts with the stages of one fast decoder (:class:`RoundStages`)."""

    def __init__(self, shared: Shared, stages: RoundStages) -> None:
        super().__init__(shared)
        self.stages = stages

    def decode(self, scenarios: Sequence[Scenario]) -> list[Rollout]:
        """Rollouts of ``scenarios`` (in their order), free-running."""
        tracks = [_Track(i, s) for i, s in enumerate(scenarios)]
        results: dict[int, Rollout] = {}
        active = tracks
        while active:
            self.stats.free_running_rounds += 1
            planned = self._plan(active, results)
            self._round(planned)
            for track, _ in planned:
                if track.done:
                    results[track.position] = self._rollout(track)
            active = [track for track, _ in planned if not track.done]
        return [results[i] for i in range(len(scenarios))]

    def _plan(
        self, tracks: Iterable[_Track], results: dict[int, Rollout]
    ) -> list[tuple[_Track, ScenarioPlan]]:
        """Each track's plan of its next turns on the conversation as it stands; a track the
        fast argument does not hold for is finished by the reference path at once."""
        planned = []
        for track in tracks:
            texts = [out.text for out in track.outputs]
            turns = track.next_turns()
            # The conversation up to the window's last turn: what the round passes over.
            variant = history_scenario(track.scenario, texts, through=turns[-1])
            plan = self.stages.planner.plan(variant, turns)
            if isinstance(plan, ReferenceOnly):
                results[track.position] = self._reference(track, plan.note)
                continue
            last = plan.turns[-1]
            # The forward pass needs the conversation up to the window's last expected token.
            cut = len(last.prompt.ids) + len(last.expected)
            planned.append((track, ScenarioPlan(plan.scenario, plan.full[:cut], plan.turns)))
        return planned

    def _round(self, planned: list[tuple[_Track, ScenarioPlan]]) -> None:
        """The passes over the planned tracks, their rows read up to each departure;
        pending turns are pooled over consecutive passes and settled together."""
        held: list[_Held] = []
        pending = tokens = 0
        for rows, decided in self._passes(planned):
            held.append(_Held.of(rows, decided))
            pending += len(decided.pending)
            tokens += len(rows) * max(len(row.plan.full) for row in rows)
            if self.stages.pool_full(pending, tokens):
                self._advance(held)
                held, pending, tokens = [], 0, 0
        self._advance(held)

    def _passes(
        self, planned: list[tuple[_Track, ScenarioPlan]]
    ) -> Iterator[tuple[list[_Row], ForwardDecisions]]:
        """The round's passes: tracks continued from their cached prefix where they have one
        (:meth:`_continue`), the others, and any whose cache cannot be cut, forward-passed."""
        continued = [(t, p, cut) for t, p in planned if (cut := t.reusable(p))]
        fresh = [(t, p) for t, p in planned if not t.reusable(p)]
        lengths = [len(p.full) for _, p, _ in continued]
        verifier = self.stages.verifier
        for chunk in even_batches(lengths, verifier.rows_per_call, verifier.max_batch_tokens):
            group = [continued[i] for i in chunk]
            got = self._continue(group)
            if got is None:
                fresh += [(t, p) for t, p, _ in group]
            else:
                yield got
        for chunk in self.stages.batch_groups([len(p.full) for _, p in fresh]):
            batch = [fresh[i] for i in chunk]
            decided = self.stages.forward_batch([p for _, p in batch])
            rows = [_Row(t, p, r) for r, (t, p) in enumerate(batch)]
            for row in rows:
                row.track.held_ids = row.plan.full
                row.track.held = (
                    CacheSlice(decided.cache, row.row, 0, len(row.plan.full))
                    if decided.cache is not None
                    else None
                )
            yield self._batched(rows), decided

    def _continue(
        self, group: list[tuple[_Track, ScenarioPlan, int]]
    ) -> tuple[list[_Row], ForwardDecisions] | None:
        """One cached pass over ``group``: each plan's conversation from its reusable prefix
        on, after that prefix cut out of the track's last cache; the teacher-forced check
        read off it (``verify`` bound). ``None`` when the caches cannot be cut."""
        fed = []
        for track, plan, cut in group:
            assert track.held is not None  # reusable() is 0 without a cache
            fed.append(
                Continuation(dataclasses.replace(track.held, length=cut), tuple(plan.full[cut:]))
            )
        started = time.perf_counter()
        passed = self.stages.verifier.cut_pass(fed)
        self.seconds.forward += time.perf_counter() - started
        if passed is None or passed.cache is None:
            return None
        self.stats.free_running_cached_passes += 1
        outputs: list[list[TurnOutput | None]] = []
        pending: list[PendingTurn] = []
        rows = []
        for r, ((track, plan, cut), checks) in enumerate(zip(group, passed.checks(), strict=True)):
            start = passed.starts[r]
            track.held_ids, track.held = (
                plan.full,
                CacheSlice(passed.cache, r, start, len(plan.full)),
            )
            # position p of the conversation: fed token p - cut, column start + p of the cache
            column = {p: p - cut for p in range(cut, len(plan.full))}
            outputs.append([None] * len(plan.turns))
            for n, turn in enumerate(plan.turns):
                self.stats.turns += 1
                decided = self.stages.forward.teacher_forced(turn, checks, column, cached=True)
                if isinstance(decided, TurnOutput):
                    outputs[r][n] = decided
                    continue
                length = len(turn.prompt.ids) + len(decided) - 1
                context = CacheSlice(passed.cache, r, start, length) if length > 0 else None
                pending.append(PendingTurn(r, n, turn, decided, context, forward_cache=False))
            rows.append(_Row(track, plan, r))
        decisions = ForwardDecisions(tuple(map(tuple, outputs)), tuple(pending), passed.cache)
        # Not counted as the rows' batch: a continued pass holds up to the verification's
        # rows per call, not a forward pass's scenarios (docs/decoding.md, "mean batch").
        return rows, decisions

    @staticmethod
    def _batched(rows: list[_Row]) -> list[_Row]:
        for row in rows:
            row.track.batch = len(rows)
        return rows

    def _advance(self, held: list[_Held]) -> None:
        """Read every row of ``held`` up to its departure (or its window's end): outputs the
        forward pass proved are taken as they are, each row's first pending turn is settled
        (all rows' together) and reading goes on while it turns out to be the truth."""
        while True:
            frontier: list[tuple[_Held, PendingTurn]] = []
            for passed in held:
                for row in passed.rows:
                    waiting = self._read(passed, row)
                    if waiting is not None:
                        frontier.append((passed, waiting))
            if not frontier:
                break
            plans = [row.plan for passed in held for row in passed.rows]
            outputs = self.stages.settle_turns(plans, [item for _, item in frontier])
            for (passed, item), output in zip(frontier, outputs, strict=True):
                passed.settled[(item.row, item.turn_no)] = output
        for passed in held:
            for row in passed.rows:
                self.stats.free_running_unused += len(row.plan.turns) - row.cursor

    def _read(self, passed: _Held, row: _Row) -> PendingTurn | None:
        """Take ``row``'s outputs in order until a departure, the window's end, or a turn not
        settled yet (returned: it is to be settled before reading on)."""
        outputs = passed.decided.outputs[row.row]
        while not row.stopped and row.cursor < len(row.plan.turns):
            output = outputs[row.cursor] or passed.settled.get((row.row, row.cursor))
            if output is None:
                return passed.pending[(row.row, row.cursor)]
            self.stats.free_running_turns += 1
            on_truth = row.track.take(output)
            if row.track.done:
                row.track.tail = prompt_tail(self.loaded, row.plan.turns[row.cursor].prompt.ids)
            row.cursor += 1
            row.stopped = not on_truth
        if not row.stopped and not row.track.done:
            row.track.window *= 2  # a window passed on the truth: plan further next round
        row.stopped = True
        return None

    def _rollout(self, track: _Track) -> Rollout:
        return Rollout(
            tuple(track.outputs),
            self.stages.path,
            track.tail,
            batch=track.batch,
            batch_size=self.stages.rows_per_pass,
            history=HISTORY_MODEL,
        )

    def _reference(self, track: _Track, note: str) -> Rollout:
        """The rest of ``track`` by the reference path (the fast argument does not hold for
        its conversation: the plan's ``note`` says why), from the outputs settled so far."""
        left = len(track.scenario.assistant_indices) - len(track.outputs)
        self.stats.reference_scenarios += 1
        self.stats.reference_scenario_turns += left
        self.stats.generated += left
        return free_running_rollout(
            self.loaded,
            track.scenario,
            self.max_new_tokens,
            self.stages.path,
            (note,),
            settled=track.outputs,
        )
