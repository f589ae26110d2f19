"""Measuring the fast path against the reference: how far its computations of the logits are
from the reference call's, on a few turns, once per decoder.

For up to ``turns`` turns of a forward pass (spread over its rows and turns), the reference
call (``generate`` on the full prompt, as the reference path runs it) is run with its
logits, and compared position by position, while it follows the truth, with the
teacher-forced logits (kinds ``first`` and ``step``), with the fast path's cached batched
generation of the same turns (``generate``), and with both computations of the verification
pass fed the reference's own tokens (``verify``). It also decides the exact mode
(:class:`~.bounds.ExactMode`): the linear probe (``probe.probe_linear_rows``), then the same
turns decoded by the exact stage from the reference's prefill, which must give the
reference's logits bit for bit at every step; where the mode is on, the exact stage's steps
from the forward pass's cache are measured too (``row_step``). The result is a
:class:`~.bounds.Calibration`: plain data the bounds are computed from (``bounds.py``), with
the exact mode. The calibrated turns are then decoded like any other (so how a turn was
decided does not depend on which turns a process happened to calibrate on).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_memeval.compat import installed_version
from pytest_memeval.compat.attention import attention_implementation
from pytest_memeval.decode.fast.bounds import (
    KINDS,
    MANTISSA_BITS,
    Calibration,
    Disagreement,
    ExactMode,
    Kind,
    Setting,
)
from pytest_memeval.decode.fast.exact import ExactStage
from pytest_memeval.decode.fast.forward import ForwardPass, PendingTurn
from pytest_memeval.decode.fast.generate import GenerateRow, Generator
from pytest_memeval.decode.fast.kvcache import CacheSlice
from pytest_memeval.decode.fast.plan import ScenarioPlan, TurnPlan
from pytest_memeval.decode.fast.probe import probe_linear_rows
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.decode.fast.verify import Continuation, Verifier
from pytest_memeval.decode.reference import ReferenceSteps, reference_steps
from pytest_memeval.model.loading import LoadedModel

if TYPE_CHECKING:
    import torch

__all__ = [
    "CALIBRATION_TURNS",
    "Calibrator",
    "Measurements",
    "PickedTurn",
    "device_name",
    "measurement_setting",
    "pick_turns",
]

#: Turns whose logits the calibration compares with the reference computation (once per
#: decoder, on its first batch; their outputs are the reference call's).
CALIBRATION_TURNS = 12


def device_name(device: str) -> str:
    """What the device is, not where: the CPU's model name (``/proc/cpuinfo``, else what
    :mod:`platform` says) or the accelerator's (``torch.cuda.get_device_name``). Two
    devices of one name run the same kernels; the index (``cuda:3``) is left out."""
    kind = device.split(":")[0]
    if kind == "cuda":
        import torch  # deferred: a model is loaded by now

        return str(torch.cuda.get_device_name(torch.device(device)))
    if kind != "cpu":
        return kind
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown cpu"


def measurement_setting(
    loaded: LoadedModel,
    forward_attention: str | None,
    *,
    batch_size: int,
    max_batch_tokens: int,
    max_new_tokens: int,
    turns: int = CALIBRATION_TURNS,
) -> dict[str, str | int | None]:
    """What a measured disagreement depends on besides the weights: dtype, the kind of
    device and its name, the CPU threads, the attention implementations, the active
    adapters, the batch settings that shape the batched computations measured, the number
    of turns measured, and the versions of the libraries that compute the logits."""
    import torch  # deferred: a model is loaded by now

    model = loaded.model
    adapters = None
    if hasattr(model, "get_base_model"):  # a peft model: which of its adapters is active
        # peft's PeftModel.active_adapters (a property; public). A plain transformers model
        # has a method of that name that raises without a recent peft: not asked.
        active = getattr(model, "active_adapters", None)
        adapters = ",".join(map(str, active)) if isinstance(active, (list, tuple)) else active
    device = str(loaded.device)
    return {
        "dtype": loaded.dtype,
        "device": device.split(":")[0],
        "device_name": device_name(device),
        # MKL/oneDNN may split a reduction differently over another number of threads
        "threads": torch.get_num_threads(),
        "attention": attention_implementation(model),
        "forward_attention": forward_attention,
        "adapters": None if adapters is None else str(adapters),
        "batch_size": batch_size,
        "max_batch_tokens": max_batch_tokens,
        "max_new_tokens": max_new_tokens,
        "calibration_turns": turns,
        "torch": installed_version("torch"),
        "transformers": installed_version("transformers"),
        "peft": installed_version("peft"),
    }


@dataclass(frozen=True)
class PickedTurn:
    """A turn the calibration measures: row ``row`` of the forward pass, its turn."""

    row: int
    turn: TurnPlan


def pick_turns(plans: Sequence[ScenarioPlan], count: int) -> list[PickedTurn]:
    """Up to ``count`` turns with a truth: per row, turns from both ends inwards (the
    longest prompt first, then the shortest, ...), taking one from each row in turn."""
    orders = []
    for plan in plans:
        turns = [t for t in plan.turns if t.expected]
        orders.append(
            [turns[-1 - k // 2] if k % 2 == 0 else turns[k // 2] for k in range(len(turns))]
        )
    picked: list[PickedTurn] = []
    depth = 0
    while len(picked) < count and any(depth < len(o) for o in orders):
        for row, order in enumerate(orders):
            if depth < len(order) and len(picked) < count:
                picked.append(PickedTurn(row, order[depth]))
        depth += 1
    return picked


class Measurements:
    """Per kind, the per-position maxima of ``|fast - reference|``, absolute and in ulps."""

    def __init__(self, dtype: str) -> None:
        self.bits = MANTISSA_BITS.get(dtype, 7)
        self.absolute: dict[Kind, list[float]] = {kind: [] for kind in KINDS}
        self.ulps: dict[Kind, list[float]] = {kind: [] for kind in KINDS}

    def add(self, kind: Kind, fast: torch.Tensor, reference: torch.Tensor) -> None:
        """Record how far two computations of one position's logits are apart."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        # On the CPU: the fast path's and the reference's logits may sit on different devices.
        fast, reference = fast.float().cpu(), reference.float().cpu()
        delta = (fast - reference).abs()
        self.absolute[kind].append(float(delta.max()))
        # In ulps as stored in the model dtype: of the logit itself, or of the top logit when
        # that is larger (the bound is counted in ulps of the top logit; a small logit far
        # below the top does not decide anything and must not inflate the count).
        top = float(torch.maximum(fast.max(), reference.max()).abs())
        magnitude = torch.maximum(fast.abs(), reference.abs()).clamp_min(max(top, 2.0**-24))
        units = torch.exp2(torch.floor(torch.log2(magnitude)) - self.bits)
        self.ulps[kind].append(float((delta / units).max()))

    def add_agreeing(
        self,
        kind: Kind,
        fast: torch.Tensor,
        fast_tokens: Sequence[int],
        reference: ReferenceSteps,
    ) -> None:
        """Record each generation step of a fast computation (``fast``: steps x
        vocabulary) against the reference call's same step, while both have produced the
        same tokens so far (after a difference the two steps read different inputs)."""
        for j, (a, b) in enumerate(zip(fast, reference.logits, strict=False)):
            if list(fast_tokens[:j]) != reference.tokens[:j]:
                break
            self.add(kind, a, b)

    def disagreement(self) -> dict[Kind, Disagreement]:
        return {k: Disagreement(tuple(self.absolute[k]), tuple(self.ulps[k])) for k in KINDS}


@dataclass(frozen=True)
class _Sample:
    """A picked turn, its prompt's cached keys and values (but the last token's) in the
    forward pass's cache, and the reference call on its prompt."""

    picked: PickedTurn
    context: CacheSlice
    reference: ReferenceSteps


class Calibrator(Stage):
    """Measures a decoder's computations against the reference call."""

    def __init__(
        self,
        shared: Shared,
        *,
        turns: int,
        generator: Generator,
        verifier: Verifier,
        exact: ExactStage | None,
    ) -> None:
        super().__init__(shared)
        self.turns = turns
        self.generator = generator
        self.verifier = verifier
        #: the exact stage whose mode the calibration decides (``None``: exact mode off)
        self.exact = exact

    def measure(self, passed: ForwardPass, setting: Setting) -> Calibration:
        """The disagreement on turns of ``passed`` (measured under ``setting``)."""
        started = time.perf_counter()
        picked = pick_turns(passed.plans, self.turns)
        measured = Measurements(self.loaded.dtype)
        # The exact stage's check continues from these calls' own prompt caches (exact_mode).
        keep = self.exact is not None
        references = [
            reference_steps(
                self.loaded, p.turn.prompt.ids, self.max_new_tokens, keep_prompt_cache=keep
            )
            for p in picked
        ]
        for p, reference in zip(picked, references, strict=True):
            self._teacher_forced(measured, passed, p, reference)
        samples: list[_Sample] = []
        if picked and passed.cache is not None:
            cache = passed.cache
            samples = [
                _Sample(p, CacheSlice(cache, p.row, 0, len(p.turn.prompt.ids) - 1), reference)
                for p, reference in zip(picked, references, strict=True)
            ]
            self._generate(measured, samples)
            self._verify(measured, samples)
        exact = None
        if self.exact is not None:
            exact = self.exact_mode([p.turn.prompt.ids for p in picked], references)
            if exact.on and samples:
                self._row_steps(measured, samples, exact)
        self.stats.calibration_turns += len(picked)
        self.seconds.calibration += time.perf_counter() - started
        return Calibration(setting, len(picked), measured.disagreement(), exact)

    def exact_mode(
        self, prompts: Sequence[Sequence[int]], references: Sequence[ReferenceSteps]
    ) -> ExactMode:
        """The exact mode: on when the linear probe passes for at least two rows, the model
        can run per-row attention, and the exact stage's logits on ``prompts`` equal the
        reference call's (``references``) bit for bit at every step (continuing from the
        calls' own prompt caches where they kept them: then from the second step on)."""
        import torch

        assert self.exact is not None
        probe = probe_linear_rows(self.loaded.model)
        why = self.exact.unavailable if probe.on else None
        if not probe.on or why is not None:
            return probe if why is None else probe.off(why)
        if not prompts:
            return probe.off("no calibration turn to check the exact stage on")
        turns = self.exact.decode(prompts, probe, keep_logits=True, prefilled=references)
        steps = 0
        for n, (turn, reference) in enumerate(zip(turns, references, strict=True)):
            if not turn.logits:
                return probe.off(
                    f"calibration turn {n + 1}: the prefill's cache is not plain "
                    "full-attention layers (sliding-window or hybrid caches)"
                )
            # A turn continued from the reference call's own prefill took its first token
            # and logits from that call: its steps after the first are what is checked.
            taken = 1 if reference.prompt_cache is not None else 0
            pairs = list(zip(turn.logits, reference.logits, strict=False))[taken:]
            for j, (mine, theirs) in enumerate(pairs, start=taken):
                if not torch.equal(mine, theirs.cpu()):
                    delta = float((mine - theirs.cpu()).abs().max())
                    return probe.off(
                        f"calibration turn {n + 1}, step {j + 1}: the exact stage's logits "
                        f"differ from the reference call's (by up to {delta:.3g})"
                    )
                steps += 1
            if list(turn.tokens) != reference.tokens:
                return probe.off(f"calibration turn {n + 1}: tokens differ from the reference")
        return replace(probe, checked_steps=steps)

    @staticmethod
    def _teacher_forced(
        measured: Measurements, passed: ForwardPass, picked: PickedTurn, reference: ReferenceSteps
    ) -> None:
        """``first`` and ``step``: the forward pass's logits, while the reference follows
        the truth (later logits are not comparable)."""
        turn = picked.turn
        start = len(turn.prompt.ids)
        for j, step in enumerate(reference.logits):
            if j >= len(turn.expected) or reference.tokens[:j] != list(turn.expected[:j]):
                break
            kind: Kind = "first" if j == 0 else "step"
            measured.add(kind, passed.logits_at(picked.row, start - 1 + j), step)

    def _generate(self, measured: Measurements, samples: Sequence[_Sample]) -> None:
        """``generate``: the fast path's cached batched generation of the same prompts,
        while it produces the reference's tokens."""
        call = self.generator.run(
            [GenerateRow(s.context, s.picked.turn.prompt.ids, 0) for s in samples]
        )
        if call is None:
            return
        for r, sample in enumerate(samples):
            measured.add_agreeing("generate", call.logits_of(r), call.tokens[r], sample.reference)

    def _row_steps(
        self, measured: Measurements, samples: Sequence[_Sample], mode: ExactMode
    ) -> None:
        """``row_step``: the exact stage's batched steps continuing from the forward pass's
        cache of each prompt (feeding its last token: the first answer token's logits come
        from a step too), while they produce the reference's tokens."""
        assert self.exact is not None
        pending = [PendingTurn(s.picked.row, 0, s.picked.turn, (), s.context) for s in samples]
        turns = self.exact.continue_cached(pending, mode, keep_logits=True)
        for turn, sample in zip(turns, samples, strict=True):
            if turn is None:
                continue
            reference = sample.reference
            for j, (a, b) in enumerate(zip(turn.logits, reference.logits, strict=False)):
                if reference.tokens[:j] != list(turn.tokens[:j]):
                    break
                measured.add("row_step", a, b)

    def _verify(self, measured: Measurements, samples: Sequence[_Sample]) -> None:
        """``verify``: both computations of the verification pass (packed, as in a first
        round, and cut) over the reference's own tokens: at position ``k`` a pass sees the
        prompt and the reference's first ``k`` tokens, as the reference's step ``k`` did."""
        fed = [
            Continuation(
                s.context,
                (s.picked.turn.prompt.ids[-1], *s.reference.tokens[: len(s.reference.logits) - 1]),
            )
            for s in samples
        ]
        for verified in (self.verifier.packed_pass(fed), self.verifier.cut_pass(fed)):
            if verified is None:
                continue
            for n, sample in enumerate(samples):
                for a, b in zip(verified.logits_of(n), sample.reference.logits, strict=True):
                    measured.add("verify", a, b)
