"""The text ``memeval bench`` prints about the fast decoder: what it decided how, what its
calibration measured, and whether that calibration was measured or reused."""

from __future__ import annotations

from pytest_memeval.decode.fast import KINDS, DecodeStats, FastDecoder, Kind, summarize

__all__ = ["describe_calibration", "describe_disagreement", "describe_stats"]


def describe_stats(stats: DecodeStats) -> str:
    """What the fast path decided how: its turns by the way each was settled."""
    parts = [f"{stats.teacher_forced} teacher-forced", f"{stats.generated} generated"]
    detail = [
        f"{count} {label}"
        for count, label in (
            (stats.generated_mismatch, "not the truth"),
            (stats.generated_near_tie, "near tie"),
            (stats.generated_no_truth, "no truth to check"),
            (stats.generated_reference_rerun, "re-decided by the reference call"),
            (stats.generated_without_cache, "without cache reuse"),
        )
        if count
    ]
    text = ", ".join(parts)
    if detail:
        text += " (" + ", ".join(detail) + ")"
    if stats.calibration_turns:
        text += f"; {stats.calibration_turns} also run by the reference call to calibrate"
    if stats.forward_only:
        text += f"; {stats.forward_only} wrong turns settled by the forward pass alone"
    if stats.draft_tokens:
        text += f"; {stats.draft_tokens} tokens taken from the truth as a draft"
    if stats.verify_passes:
        text += (
            f"; {stats.verified} generated turns settled by the verification pass "
            f"({stats.verify_passes} passes, {stats.verify_tokens} tokens accepted), "
            f"{stats.generate_turns} left to generate ({stats.generate_grown_drafts} "
            "from a draft the pass made longer)"
        )
    if stats.exact_turns or stats.exact_cached_turns:
        text += (
            f"; exact steps: {stats.exact_cached_turns} generated turns settled from the "
            f"forward pass's cache, {stats.exact_turns} from the reference's own prefill "
            f"({stats.exact_cached_near_tie} of them after a near tie from the cache); "
            f"{stats.exact_steps} batched steps, {stats.exact_tokens} tokens"
        )
    if stats.reference_scenarios:
        text += f"; {stats.reference_scenarios} scenarios on the reference path"
    if stats.free_running_rounds:
        text += (
            f"; free-running: {stats.free_running_rounds} rounds, {stats.free_running_turns} "
            f"turns accepted, {stats.free_running_cached_passes} passes from a cached prefix, "
            f"{stats.free_running_unused} planned turns past a departure"
        )
    return text


def describe_disagreement(fast: FastDecoder) -> list[str]:
    """What the calibration measured and the bounds it set, one line per kind."""
    labels: dict[Kind, str] = {
        "first": "first answer token (forward pass vs generate's prefill)",
        "step": "later answer tokens (forward pass vs generate's cached steps)",
        "generate": "fast generate (cropped cache, batched) vs the reference call",
        "verify": "verification pass (cached multi-token forward) vs the reference call",
        "row_step": "exact steps from the forward pass's cache vs the reference call",
    }
    assert set(labels) == set(KINDS)
    bounds = fast.bounds
    lines = ["  logit disagreement with the reference computation, max |delta| per position:"]
    for kind, label in labels.items():
        measured = bounds.disagreement(kind)
        top, p99 = summarize(measured.absolute)
        top_ulps, p99_ulps = summarize(measured.ulps)
        # 16-bit: ulps say more than fp32 units
        shown = (
            (
                f"max {top:.3g} ({top_ulps:.2g} ulp), p99 {p99:.3g} ({p99_ulps:.2g} ulp)"
                if bounds.relative
                else f"max {top:.3g}, p99 {p99:.3g}"
            )
            + f" over {len(measured.absolute)} positions"
            if measured.absolute
            else "not measured"
        )
        bound = f"{bounds.absolute[kind]:.3g}"
        if bounds.ulps[kind]:
            bound = f"{bounds.ulps[kind]:g} ulp of the top logit"
        lines.append(f"    {label}: {shown}; bound {bound}")
    return lines


def describe_calibration(fast: FastDecoder, fast_seconds: float, reference: float) -> str:
    """Whether the calibration was measured or reused, and the fast time apart from it."""
    outcome = fast.calibration_outcome
    if outcome is None:
        return "calibration: none (a fixed margin)" if fast.bounds.fixed else "calibration: none"
    stored = "not stored" if outcome.entry is None else f"stored in {outcome.entry}"
    if outcome.source == "measured":
        how = f"measured now, {outcome.seconds:.2f} s ({outcome.stored.calibration.turns} turns)"
    else:
        how = (
            f"reused (measured {outcome.stored.created}, {outcome.stored.seconds:.2f} s then; "
            "--recalibrate to measure it again)"
        )
    apart = fast_seconds - outcome.seconds
    return (
        f"calibration: {how}, {stored}\n"
        f"fast without calibration: {apart:8.2f} s  ({reference / apart:.1f}x the reference)"
    )
