"""The fast decoder: plan -> forward -> verify -> generate (or exact steps), with the calibration
as one step.

:class:`FastDecoder` orchestrates the stages (each a module of this package) and holds what
they share: the bounds (``bounds.py``), the statistics (``stats.py``) and the rollouts
prefetched for ``rollout``. Scenarios are planned (``plan.py``; those the fast argument does
not hold for go to the reference path), run through forward passes in length-sorted batches
(``forward.py``), the first of which is also measured against the reference call
(``calibration.py``); the turns the forward passes do not settle are pooled over
consecutive batches and settled by the verification rounds (``verify.py``), then by
``generate`` (``generate.py``); in exact mode (decided by the calibration, see
:class:`~.bounds.ExactMode`) by the exact stage instead (``exact.py``). Free-running
(``history="model"``), the same stages run in rounds over the conversation as the model has
made it so far (``history.py``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.history import HISTORY_MODEL, HISTORY_TRUTH, history_name
from pytest_memeval.core.records import Rollout, TurnOutput
from pytest_memeval.decode.fast.answers import AnswerIndex
from pytest_memeval.decode.fast.bounds import Bounds, Calibration, ExactMode
from pytest_memeval.decode.fast.calibration import (
    CALIBRATION_TURNS,
    Calibrator,
    measurement_setting,
)
from pytest_memeval.decode.fast.exact import ExactStage
from pytest_memeval.decode.fast.forward import (
    ForwardDecisions,
    ForwardPass,
    ForwardStage,
    PendingTurn,
    ProvenOutputs,
    forward_attention_for,
)
from pytest_memeval.decode.fast.generate import Generator
from pytest_memeval.decode.fast.history import FreeRunner, RoundStages
from pytest_memeval.decode.fast.plan import Planner, ReferenceOnly, ScenarioPlan
from pytest_memeval.decode.fast.pool import HeldBatch, Planned, Pool
from pytest_memeval.decode.fast.rules import (
    ACCELERATOR_BATCH_SIZE,
    CPU,
    CPU_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    FORWARD_MIN_FILL,
    batching_rules,
)
from pytest_memeval.decode.fast.shared import Shared
from pytest_memeval.decode.fast.stored import CalibrationOutcome, CalibrationStore, Measurement
from pytest_memeval.decode.fast.verify import Verifier
from pytest_memeval.decode.reference import prompt_tail, reference_rollout
from pytest_memeval.model.loading import LoadedModel

__all__ = [
    "DEFAULT_ACCELERATOR_BATCH_SIZE",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_BATCH_TOKENS",
    "FORWARD_MIN_FILL",
    "FastDecoder",
]

#: Default scenarios per forward pass by device kind, and the token budget: chosen with the
#: other batching rules in ``rules.py`` (kept here under these names for existing callers).
DEFAULT_BATCH_SIZES: dict[str, int] = {CPU: CPU_BATCH_SIZE}
DEFAULT_ACCELERATOR_BATCH_SIZE = ACCELERATOR_BATCH_SIZE


class FastDecoder:
    """Teacher-forced greedy check over whole conversations, batched across scenarios.

    ``prefetch(scenarios)`` decodes a group of scenarios in length-sorted batches and keeps
    their rollouts until ``rollout`` asks for them; ``rollout`` of a scenario not prefetched
    decodes it alone. :attr:`stats` counts what was decided how and :attr:`seconds` where the
    time went (for ``memeval bench`` and tests).

    ``margin``: one absolute bound for every kind of decision instead of calibrated ones (no
    calibration then, unless ``calibrate=True``); ``calibrate=False``: the fixed defaults
    (``bounds.MARGINS``). ``forward_attention``: the attention implementation of the forward
    passes (``"auto"``: ``forward.FORWARD_ATTENTION``; ``None``: the one the model was loaded
    with); ``generate`` always runs with the model's own. ``history``: ``truth``
    (teacher-forced, the default) or ``model`` (free-running: each turn's prompt holds the
    decoder's own earlier outputs; ``history.py``). ``store``: where calibrations are kept
    between runs and workers (``stored.py``): the calibration is taken from it when it holds
    one of this model and setting, else measured and put there. ``exact``: ``None``, the calibration
    decides whether the exact stage settles the pending turns (exact mode); ``False``, never
    (the bounded verify -> generate path).
    """

    path = "fast"

    def __init__(
        self,
        loaded: LoadedModel,
        max_new_tokens: int,
        *,
        batch_size: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        margin: float | None = None,
        calibrate: bool | None = None,
        calibration_turns: int = CALIBRATION_TURNS,
        forward_attention: str | None = "auto",
        history: str = HISTORY_TRUTH,
        store: CalibrationStore | None = None,
        exact: bool | None = None,
    ) -> None:
        device_type = str(loaded.device).split(":")[0]
        #: how forward passes are composed on this device in this dtype (``rules.py``)
        self.rules = batching_rules(device_type, loaded.dtype)
        if batch_size is None:
            batch_size = self.rules.batch_size
        if batch_size < 1 or max_batch_tokens < 1 or max_new_tokens < 1:
            raise ValueError("batch_size, max_batch_tokens and max_new_tokens must be >= 1")
        self.loaded = loaded
        self.history = history_name(history, "history")
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.calibration_turns = calibration_turns
        #: the margin guard: fixed to ``margin`` if given, else :func:`~.bounds.default_margin`
        #: until a calibration is used
        self.bounds = Bounds(loaded.dtype, device_type, margin=margin)
        shared = Shared.new(loaded, max_new_tokens, self.bounds)
        #: what was decided how, and where the time went
        self.stats, self.seconds = shared.stats, shared.seconds
        #: whether the next forward pass is measured (the first, once)
        self._calibration_due = (margin is None) if calibrate is None else calibrate
        #: the calibration this decoder measured itself (``None`` until it did)
        self.measured: Calibration | None = None
        self.store = store
        #: how the calibration in use came from the store: measured or reused (``None``
        #: without a store, or until the first forward pass)
        self.calibration_outcome: CalibrationOutcome | None = None
        #: the attention implementation of the forward passes (``None``: the model's own)
        self.forward_attention = forward_attention_for(loaded, forward_attention)
        #: False: exact mode turned off by the caller
        self.exact_allowed = exact is not False
        self._ready: dict[str, Rollout] = {}
        self._build_stages(shared)
        self.stats.exact_mode = self.exact_mode.describe()

    def _build_stages(self, shared: Shared) -> None:
        """The stages, in the order a scenario meets them."""
        loaded, max_batch_tokens = self.loaded, self.max_batch_tokens
        proven = ProvenOutputs(loaded)
        self.planner = Planner(shared)
        self.forward = ForwardStage(shared, attention=self.forward_attention, proven=proven)
        self.generator = Generator(shared, max_batch_tokens=max_batch_tokens)
        self.answers = AnswerIndex(shared.stop, shared.max_new_tokens)
        self.verifier = Verifier(
            shared,
            proven=proven,
            answers=self.answers,
            rows_per_call=self.generator.rows_per_call,
            max_batch_tokens=max_batch_tokens,
        )
        self.exact = ExactStage(shared)
        self.calibrator = Calibrator(
            shared,
            turns=self.calibration_turns,
            generator=self.generator,
            verifier=self.verifier,
            exact=self.exact if self.exact_allowed else None,
        )
        self.free_runner = FreeRunner(
            shared,
            RoundStages(
                self.planner,
                self.forward,
                self.verifier,
                path=self.path,
                rows_per_pass=self.rows_per_pass,
                forward_batch=self.forward_batch,
                settle_turns=self.settle_turns,
                batch_groups=self.batch_groups,
                pool_full=self.pool_full,
            ),
        )

    # -- Decoder protocol --------------------------------------------------------------------

    def rollout(self, scenario: Scenario) -> Rollout:
        """The scenario's rollout: prefetched if it was, else decoded now on its own."""
        ready = self._ready.pop(scenario.id, None)
        if ready is not None:
            return ready
        return self.decode([scenario])[0]

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """Decode ``scenarios`` now, batched, and keep their rollouts for ``rollout``."""
        first: dict[str, Scenario] = {}
        for s in scenarios:
            first.setdefault(s.id, s)
        todo = [s for s in first.values() if s.id not in self._ready]
        if todo:
            for scenario, rollout in zip(todo, self.decode(todo), strict=True):
                self._ready[scenario.id] = rollout

    @property
    def prefetched(self) -> frozenset[str]:
        """Ids of the scenarios prefetched and not yet asked for."""
        return frozenset(self._ready)

    # -- decoding ----------------------------------------------------------------------------

    def decode(self, scenarios: Sequence[Scenario]) -> list[Rollout]:
        """Rollouts of ``scenarios`` (in their order): plan -> forward -> verify -> generate
        (free-running: in rounds, ``history.py``)."""
        if self.history == HISTORY_MODEL:
            return self.free_runner.decode(scenarios)
        results: dict[int, Rollout] = {}
        planned = self._plan(scenarios, results)
        # Forward passes of similar lengths, longest first; the turns they leave pending are
        # pooled over consecutive batches and settled together: a generate step costs about
        # the same for 4 rows as for 64.
        pool = Pool()
        groups = self.batch_groups([len(p.plan.full) for p in planned])
        for batch in ([planned[i] for i in group] for group in groups):
            pool.add(batch, self.forward_batch([p.plan for p in batch]))
            if self.pool_full(pool.turns, pool.tokens):
                self._settle(pool.take(), results)
        self._settle(pool.take(), results)
        return [results[i] for i in range(len(scenarios))]

    def _plan(self, scenarios: Sequence[Scenario], results: dict[int, Rollout]) -> list[Planned]:
        """Each scenario's plan; those the fast argument does not hold for are decoded by
        the reference path into ``results`` at once."""
        planned: list[Planned] = []
        for position, scenario in enumerate(scenarios):
            self.stats.scenarios += 1
            plan = self.planner.plan(scenario)
            if isinstance(plan, ReferenceOnly):
                results[position] = self._reference_rollout(plan)
            else:
                planned.append(Planned(position, plan))
        return planned

    @property
    def rows_per_pass(self) -> int:
        """Most scenarios one forward pass holds here: ``batch_size`` under the device's
        rules (1 for a 16-bit model on the CPU); each rollout's ``batch_size``."""
        return self.rules.rows(self.batch_size)

    def batch_groups(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of ``lengths`` in forward passes: the plan of the device's batching rules
        (:meth:`~.rules.BatchingRules.plan`)."""
        return self.rules.plan(
            lengths, batch_size=self.batch_size, max_batch_tokens=self.max_batch_tokens
        )

    def pool_full(self, pending: int, tokens: int) -> bool:
        """Whether ``pending`` turns held over passes of ``tokens`` padded tokens are settled
        now: a generate step costs about the same for 4 rows as for 64, so fewer, fuller
        calls, within the rows of one call and the token budget the caches may hold."""
        return pending >= self.generator.rows_per_call or tokens >= self.max_batch_tokens

    def forward_batch(self, plans: list[ScenarioPlan]) -> ForwardDecisions:
        """One forward pass, measured against the reference first when a calibration is
        due (the bounds its decisions are read with come from it)."""
        passed = self.forward.run(plans)
        if self._calibration_due:
            self.calibrate(passed)
        return self.forward.decide(passed)

    def _settle(self, pool: list[HeldBatch], results: dict[int, Rollout]) -> None:
        """Settle the pooled turns (verification rounds, then ``generate`` for the rest),
        then complete the rollouts of the pooled batches."""
        plans = [p.plan for held in pool for p in held.planned]
        pending = [item for held in pool for item in held.decided.pending]
        outcomes = iter(self.settle_turns(plans, pending))
        for held in pool:
            outputs = held.decided.settled(itertools.islice(outcomes, len(held.decided.pending)))
            for planned, row in zip(held.planned, outputs, strict=True):
                results[planned.position] = self._rollout(planned.plan, row, len(held.planned))

    def settle_turns(
        self, plans: Sequence[ScenarioPlan], pending: Sequence[PendingTurn]
    ) -> list[TurnOutput]:
        """Each of ``pending``'s output: in exact mode the exact stage; else the verification
        rounds (guessing from the answers of ``plans``), then ``generate`` for the rest."""
        self.answers.learn(t.expected for plan in plans for t in plan.turns)
        self.stats.generated += len(pending)
        self.stats.draft_tokens += sum(len(p.draft) for p in pending)
        if (mode := self.exact_mode).on:  # every pending turn bit for bit as the reference
            return self.exact.settle(pending, mode)
        settled = self.verifier.settle(pending)  # else the turn as the rounds leave it
        rest = [s for s in settled if isinstance(s, PendingTurn)]
        generated = iter(self.generator.generate(rest))
        return [s if isinstance(s, TurnOutput) else next(generated) for s in settled]

    def _rollout(self, plan: ScenarioPlan, row: list[TurnOutput | None], batch: int) -> Rollout:
        done = tuple(o for o in row if o is not None)
        assert len(done) == len(plan.turns)
        tail = prompt_tail(self.loaded, plan.turns[-1].prompt.ids)
        return Rollout(done, self.path, tail, batch=batch, batch_size=self.rows_per_pass)

    def _reference_rollout(self, plan: ReferenceOnly) -> Rollout:
        """Exactly what :class:`~.reference.ReferenceDecoder` does, plus the plan's note."""
        turns = len(plan.prompts)
        self.stats.reference_scenarios += 1
        self.stats.reference_scenario_turns += turns
        self.stats.turns += turns
        self.stats.generated += turns
        started = time.perf_counter()
        rollout = reference_rollout(
            self.loaded, plan.prompts, self.max_new_tokens, self.path, (plan.note,)
        )
        self.seconds.generate += time.perf_counter() - started
        return rollout

    # -- calibration -------------------------------------------------------------------------

    @property
    def exact_mode(self) -> ExactMode:
        """Whether the exact stage settles the pending turns, and why not: the calibration
        in use decides (:class:`~.bounds.ExactMode`)."""
        if not self.exact_allowed:
            return ExactMode(0, "turned off (exact=False)")
        calibration = self.bounds.calibration
        if calibration is None:
            return ExactMode(0, "no calibration measured (a fixed margin, or calibrate=False)")
        if calibration.exact is None:
            return ExactMode(0, "the calibration in use did not decide it")
        return calibration.exact

    @property
    def calibration(self) -> Calibration | None:
        """The calibration in use (measured here or taken), or ``None``."""
        return self.bounds.calibration

    def calibrate(self, passed: ForwardPass) -> Calibration:
        """Measure ``passed``'s computations against the reference call and use what was
        measured (done once per decoder, on its first forward pass, unless a calibration
        was given or a ``margin`` fixed); with a ``store``, take the stored calibration of
        this setting instead when there is one, and store what is measured."""
        self._calibration_due = False
        setting = self.measurement_setting()
        if self.store is None:
            calibration = self.measured = self.calibrator.measure(passed, setting)
        else:
            outcome = self.store.obtain(
                setting, lambda: Measurement(self.calibrator.measure(passed, setting))
            )
            self.calibration_outcome = outcome
            calibration = outcome.stored.calibration
            if outcome.source == "measured":
                self.measured = calibration
        self.bounds.use(calibration)
        self.stats.exact_mode = self.exact_mode.describe()
        return calibration

    def measurement_setting(self) -> dict[str, str | int | None]:
        """What this decoder's measurements depend on besides the weights
        (:func:`~.calibration.measurement_setting`)."""
        return measurement_setting(
            self.loaded,
            self.forward_attention,
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            max_new_tokens=self.max_new_tokens,
            turns=self.calibration_turns,
        )

    def use_calibration(self, calibration: Calibration) -> None:
        """Use ``calibration`` (measured on this model: same weights) instead of
        calibrating; a decoder given a ``margin`` keeps it. ``ValueError`` naming the
        settings that differ from the ones it was measured under."""
        mine, theirs = self.measurement_setting(), calibration.setting
        differ = sorted(k for k in mine if mine[k] != theirs.get(k))
        if differ:
            raise ValueError(
                "a calibration is only valid for the settings it was measured with; "
                f"these differ: {', '.join(differ)}"
            )
        self.bounds.use(calibration)
        self._calibration_due = False
        self.stats.exact_mode = self.exact_mode.describe()

    def adopt_calibration(self, other: FastDecoder) -> bool:
        """Take the calibration ``other`` measured (or took from its store) instead of
        calibrating: for another decoder of the same loaded model (e.g. ``memeval bench``'s
        growth table after its main run); see :meth:`use_calibration`. False (nothing
        adopted) when ``other`` has none of its own."""
        if other.loaded.model is not self.loaded.model:
            raise ValueError("a calibration is only valid for the model it was measured on")
        outcome = other.calibration_outcome
        taken = outcome.stored.calibration if outcome is not None else other.measured
        if taken is None or not taken.turns:
            return False
        # The same model object can have changed in place since (another adapter active,
        # another attention implementation, dtype or device), and the batch settings shape
        # the batched computations measured: all must be what they were at calibration.
        self.use_calibration(taken)
        return True
