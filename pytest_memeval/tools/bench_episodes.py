"""``memeval bench`` on a closed-loop profile: the fast policy against the reference policy.

Both policies act in the profile's real environment (``env``: TextWorld Express, or a plugin's
Gymnasium env) on the same seeds, with the same loaded model: first the reference policy
(:class:`~pytest_memeval.decode.policy.ModelPolicy`: one greedy ``generate`` over the whole
conversation per step, one episode at a time), then the fast policy
(:class:`~pytest_memeval.decode.fast.FastPolicy`: each episode's cache kept across steps, the
steps of ``--episodes-together`` episodes batched, as a pytest run's worker steps them). The
command prints both times, the ratio, what the fast policy decided how and where its time
went, and whether every trajectory (each action of each step of each episode, and the
conversation the next prompt would be built from) is identical; above the last line, a
``floor:`` line: one forward pass over each episode's whole final conversation (no generation,
no cache), what no policy that reads every token once can beat on this machine. Its last line
reads::

    fast/reference speedup: <ratio>x, trajectories identical: <yes|no>

The environments are started before either timing (a JVM each for TextWorld Express): the
times are the policies' and the environments' steps, not their start.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_memeval.compat.attention import switched_attention
from pytest_memeval.core.formatting import shown_list
from pytest_memeval.core.profiles import Profile
from pytest_memeval.decode.fast import (
    DEFAULT_MAX_BATCH_TOKENS,
    EPISODES_TOGETHER,
    CalibrationStore,
    FastPolicy,
)
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import EnvSpec, Episode, EpisodeRunner
from pytest_memeval.model.loading import LoadedModel

__all__ = ["ClosedLoopComparison", "bench_closed_loop", "compare_policies"]


@dataclass(frozen=True)
class ClosedLoopComparison:
    """Both policies on one set of seeds: their episodes and times, the fast policy (its
    statistics) and the seeds whose trajectories differ."""

    reference: list[Episode]
    reference_seconds: float
    fast: list[Episode]
    fast_seconds: float
    policy: FastPolicy
    differ: list[int]

    @property
    def ratio(self) -> float:
        """Reference seconds over fast seconds."""
        return self.reference_seconds / self.fast_seconds if self.fast_seconds > 0 else 0.0


def _same(a: Episode, b: Episode) -> bool:
    return (a.as_plain(), a.messages) == (b.as_plain(), b.messages)


def compare_policies(
    runner: EpisodeRunner,
    loaded: LoadedModel,
    max_new_tokens: int,
    *,
    together: int = EPISODES_TOGETHER,
    margin: float | None = None,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    store: CalibrationStore | None = None,
) -> ClosedLoopComparison:
    """The reference policy on each of the runner's seeds in turn, then the fast policy with
    ``together`` episodes stepped at once, in the same environments; timed apart. ``store``:
    the fast policy's calibration store (a stored calibration is reused)."""
    seeds = list(runner.spec.seeds)
    runner.start(min(together, len(seeds)))
    reference_policy = ModelPolicy(loaded, max_new_tokens)
    # Warm up (the first calls allocate and import), outside the timings.
    reference_policy([{"role": "user", "content": "Look around."}])
    started = time.perf_counter()
    reference = [runner.run(seed, reference_policy) for seed in seeds]
    reference_seconds = time.perf_counter() - started
    fast_policy = FastPolicy(
        loaded, max_new_tokens, margin=margin, max_batch_tokens=max_batch_tokens, store=store
    )
    started = time.perf_counter()
    fast: list[Episode] = []
    for first in range(0, len(seeds), together):
        fast += runner.run_together(seeds[first : first + together], fast_policy.decide)
    fast_seconds = time.perf_counter() - started
    differ = [seed for seed, a, b in zip(seeds, reference, fast, strict=True) if not _same(a, b)]
    return ClosedLoopComparison(
        reference, reference_seconds, fast, fast_seconds, fast_policy, differ
    )


def _floor(policy: FastPolicy, episodes: Sequence[Episode]) -> float:
    """Seconds of one forward pass over each episode's whole final conversation (its next
    prompt): no generation, no cache, one episode per call, the fast path's attention."""
    import torch  # deferred: loaded before this runs

    loaded = policy.loaded
    sequences = [policy.prompt_ids(e.messages) for e in episodes]
    with torch.inference_mode(), switched_attention(loaded.model, policy.attention):
        started = time.perf_counter()
        for ids in sequences:
            loaded.model(torch.tensor([ids], device=loaded.device), use_cache=False)
        if str(loaded.device).startswith("cuda"):
            torch.cuda.synchronize()  # kernels run asynchronously: wait for the last one
        return time.perf_counter() - started


def _describe_spec(spec: EnvSpec) -> str:
    seeds = list(spec.seeds)
    shown = (
        f"seeds {seeds[0]}-{seeds[-1]}"
        if seeds == list(range(seeds[0], seeds[-1] + 1))
        else (f"seeds {shown_list([str(s) for s in seeds])}")
    )
    return f"{spec.backend} {spec.game}, fold {spec.fold}, {shown}, max_steps {spec.max_steps}"


def _describe_calibration(run: ClosedLoopComparison) -> list[str]:
    """Whether the fast policy's calibration was measured or reused, and the fast time apart
    from the reference calls it made to measure it."""
    policy = run.policy
    outcome = policy.calibration_outcome
    stats = policy.stats
    if policy.bounds.fixed:
        return ["calibration: none (a fixed margin)"]
    if outcome is not None and outcome.source == "reused":
        stored = outcome.stored
        return [
            f"calibration: reused (measured {stored.created} over "
            f"{stored.calibration.turns} cached steps, stored in {outcome.entry}; "
            "--recalibrate to measure it again)"
        ]
    if not stats.calibration_steps:
        return ["calibration: none (no cached step to measure)"]
    where = (
        "not stored" if outcome is None or outcome.entry is None else (f"stored in {outcome.entry}")
    )
    apart = run.fast_seconds - stats.calibration_seconds
    ratio = run.reference_seconds / apart if apart > 0 else 0.0
    return [
        f"calibration: measured now over {stats.calibration_steps} cached steps (their "
        f"reference calls {stats.calibration_seconds:.2f} s), {where}",
        f"fast without calibration: {apart:8.2f} s  ({ratio:.1f}x the reference)",
    ]


def bench_closed_loop(
    args: argparse.Namespace,
    profile: Profile,
    loaded: LoadedModel,
    store: CalibrationStore | None = None,
) -> int:
    """Run the closed-loop benchmark of ``profile`` (see the module docstring); the exit
    status: 0 when every trajectory is identical, 1 when any differs."""
    import torch

    spec = profile.env
    assert spec is not None  # the caller checked: a closed-loop profile
    if args.limit is not None:
        spec = dataclasses.replace(spec, seeds=spec.seeds[: args.limit])
    max_new = profile.generation.max_new_tokens
    together = args.episodes_together
    print(
        f"memeval bench: profile {profile.name}, closed loop, {len(spec.seeds)} episodes "
        f"({_describe_spec(spec)}); {loaded.dtype}, adapter {profile.adapter or 'none'}, "
        f"max_new_tokens {max_new}, {args.device}, {torch.get_num_threads()} torch threads"
    )
    with EpisodeRunner(spec, system=profile.system) as runner:
        run = compare_policies(
            runner,
            loaded,
            max_new,
            together=together,
            margin=args.margin,
            max_batch_tokens=args.max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS,
            store=store,
        )
    stats = run.policy.stats
    steps = sum(len(e.steps) for e in run.reference)
    print(
        f"reference: {run.reference_seconds:8.2f} s  ({steps} steps, one episode at a time, "
        "the whole conversation through generate at each step)"
    )
    print(f"fast:      {run.fast_seconds:8.2f} s  (up to {together} episodes stepped together)")
    print(f"  {stats.describe()}")
    print(
        f"  {stats.extend_passes} extension passes ({stats.flat_extend_passes} in one row), "
        f"{stats.generate_calls} batched generate calls; seconds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in stats.seconds.items())
    )
    for line in _describe_calibration(run):
        print(line)
    floor = _floor(run.policy, run.reference)
    print(
        f"floor:     {floor:8.2f} s  one forward pass over every episode's whole conversation "
        f"(no generation); fast path {run.fast_seconds / floor:.1f}x the floor"
    )
    if run.differ:
        print(
            f"trajectories differ in {len(run.differ)} episodes: seeds "
            f"{shown_list([str(s) for s in run.differ])}"
        )
    verdict = "no" if run.differ else "yes"
    print(f"fast/reference speedup: {run.ratio:.1f}x, trajectories identical: {verdict}")
    return 1 if run.differ else 0
