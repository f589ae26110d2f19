"""When a greedy decision is trusted: the margin guard's bounds, and the calibration they come from.

The fast path stands in for the reference computation with other computations of the same
logits (batched, cached, packed), which agree with it only up to rounding. A decision is
trusted when its top-1/top-2 margin (fp32) is far enough from a tie that the reference
computation makes it too: at least the bound of its kind (:data:`KINDS`). The bounds come
from a :class:`Calibration` (what was measured: plain data, JSON round trip) through
:func:`calibrated_bound`, or are fixed (:func:`default_margin`, or a margin the caller gives).
:class:`Bounds` holds the policy, the measurements and :meth:`Bounds.trusted`. See
``docs/decoding.md``, "The margin guard, set from measurements".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias, cast

__all__ = [
    "KINDS",
    "MANTISSA_BITS",
    "MARGINS",
    "MIN_MARGINS",
    "PRIOR_ULPS",
    "SAFETY",
    "Bounds",
    "Calibration",
    "Disagreement",
    "ExactMode",
    "Kind",
    "Setting",
    "calibrated_bound",
    "default_margin",
    "summarize",
    "ulp",
]

#: The kinds of greedy decision the fast path relies on, each compared with the reference
#: computation it stands in for: ``first``: the teacher-forced logits at a prompt's last
#: position vs ``generate``'s prefill; ``step``: teacher-forced logits at later answer
#: positions vs ``generate``'s cached steps; ``generate``: the fast path's batched generation
#: from the cropped cache vs ``generate``'s steps on the full prompt; ``verify``: the
#: verification pass (one cached multi-token forward pass over a guessed continuation, see
#: ``verify.py``) vs ``generate``'s steps on the full prompt; ``row_step``: in exact mode,
#: single-token steps of many rows with per-row attention (``exact.py``) continuing from the
#: forward pass's cache vs ``generate``'s steps on the full prompt (the steps compute as
#: ``generate``'s do; only the prompt's cache is the forward pass's).
Kind: TypeAlias = Literal["first", "step", "generate", "verify", "row_step"]
KINDS: tuple[Kind, ...] = ("first", "step", "generate", "verify", "row_step")

#: Bounds used where no measurement exists (a kind of decision the calibration did not see, or
#: ``calibrate=False``): the fixed margins of earlier releases, far above any disagreement
#: measured (see ``docs/decoding.md``). Top-1/top-2 logit margins in fp32 units, by model dtype.
MARGINS: dict[str, float] = {"float32": 1e-2, "float64": 1e-6, "float16": 0.25, "bfloat16": 1.0}

#: The smallest absolute bound, by dtype, where the calibration measured the disagreement: in
#: fp32 about 85x the largest disagreement measured on the demo (1.17e-5 at logits up to 15)
#: and 28x the bound it calibrates to; in 16-bit the bound is relative (below). Without a
#: measurement the fixed :data:`MARGINS` apply.
MIN_MARGINS: dict[str, float] = {"float32": 1e-3, "float64": 1e-6, "float16": 0.0, "bfloat16": 0.0}

#: Mantissa bits by dtype: a logit ``x`` is stored to one unit in the last place (ulp),
#: ``2 ** (floor(log2 |x|) - bits)``. 16-bit disagreement is counted in these units, since
#: it grows with the logit's magnitude.
MANTISSA_BITS: dict[str, int] = {"float32": 23, "float64": 52, "float16": 10, "bfloat16": 7}

#: The per-logit disagreement (in ulps of that logit) assumed possible in 16-bit even where a
#: calibration saw none, by kind of decision (:data:`KINDS`). Measured on the demo in
#: bfloat16 on CPU (620 positions, compared one by one): the teacher-forced pass and ``generate``'s
#: prefill agreed bit for bit at every prompt's last position; cached steps differed by up to
#: one ulp at about 2% of positions, which a small calibration sample can miss. Half an ulp
#: for ``first`` is the smallest difference rounding to the dtype can leave.
PRIOR_ULPS: dict[str, dict[Kind, float]] = {
    dtype: {"first": 0.5, "step": 1.0, "generate": 1.0, "verify": 1.0, "row_step": 1.0}
    for dtype in ("float16", "bfloat16")
}

#: Bound = SAFETY x (largest top-1/top-2 change the disagreement allows, i.e. twice the
#: largest per-logit difference), never below :data:`MIN_MARGINS`. In 16-bit, margins are
#: multiples of an ulp, so a factor of 1.5 makes "at least the bound" mean "more than twice
#: the disagreement" (at one ulp: three ulps): a margin of exactly 2d could become a tie.
SAFETY = 1.5


def default_margin(dtype: str) -> float:
    """The bound used for ``dtype`` where nothing was measured (see :data:`MARGINS`)."""
    return MARGINS.get(dtype, MARGINS["bfloat16"])


def ulp(value: float, dtype: str) -> float:
    """One unit in the last place of ``value`` stored in ``dtype``."""
    _, exponent = math.frexp(abs(value) or 1.0)  # |value| = m * 2**exponent, 0.5 <= m < 1
    return 2.0 ** (exponent - 1 - MANTISSA_BITS.get(dtype, 7))


def calibrated_bound(
    dtype: str,
    kind: Kind,
    disagreements: Sequence[float],
    disagreement_ulps: Sequence[float],
    device_type: str = "cpu",
) -> tuple[float, float]:
    """``(absolute, ulps)`` bound for one kind of decision from the measured per-position
    maxima of ``|fast logit - reference logit|`` (absolute and in ulps of each logit).

    Two logits each off by at most ``d`` move the top-1/top-2 gap by at most ``2 d``: a
    decision is trusted when its margin is at least :data:`SAFETY` times that. In 16-bit the
    bound is counted in ulps of the decision's top logit, with ``d`` at least
    :data:`PRIOR_ULPS`. In fp32/fp64 it is absolute, never below the floor:
    :data:`MIN_MARGINS` on the CPU, where it was measured, and the fixed :data:`MARGINS` on
    any other device (not measured there: accelerator kernels choose their reductions by
    shape). Without measurements in fp32: :func:`default_margin`.
    """
    if dtype in PRIOR_ULPS:
        d = max([PRIOR_ULPS[dtype][kind], *disagreement_ulps])
        return MIN_MARGINS.get(dtype, 0.0), SAFETY * 2.0 * d
    if not disagreements:
        return default_margin(dtype), 0.0
    floors = MIN_MARGINS if device_type == "cpu" else MARGINS
    floor = floors.get(dtype, floors["float32"])
    return max(floor, SAFETY * 2.0 * max(disagreements)), 0.0


def summarize(values: Sequence[float], quantile: float = 0.99) -> tuple[float, float]:
    """``(max, quantile)`` of ``values`` (nearest rank); ``(nan, nan)`` when empty."""
    if not values:
        return math.nan, math.nan
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))
    return ordered[-1], ordered[rank]


#: What a measured disagreement depends on besides the weights (dtype, device, attention
#: implementations, active adapters, batch settings): see ``calibration.measurement_setting``.
Setting: TypeAlias = Mapping[str, str | int | None]


@dataclass(frozen=True)
class Disagreement:
    """Per-position maxima of ``|fast logit - reference logit|`` for one kind of decision:
    in fp32 units, and in ulps (as stored in the model dtype) of each logit or of the
    position's top logit where that is larger."""

    absolute: tuple[float, ...] = ()
    ulps: tuple[float, ...] = ()


def _floats(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"calibration: {where} must be a list of numbers")
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class ExactMode:
    """Whether the exact stage (``exact.py``) settles the turns the forward pass leaves
    pending, decided once per model and settings: plain data, stored with the
    :class:`Calibration` (:meth:`to_dict`, :meth:`from_dict`). On when every linear weight
    shape of the model gives rows bit-identical to one row alone for up to :attr:`rows`
    rows (at least 2) and the calibration turns decoded by the exact stage are bit-identical
    to the reference call at every step; else off, with the reason."""

    #: rows per batched step: the largest row count every linear shape passed for (0: none)
    rows: int
    #: why the mode is off (``None``: on)
    reason: str | None = None
    #: the linear weight shapes probed (``"out x in dtype"``), and the calibration steps
    #: compared bit for bit with the reference call
    shapes: tuple[str, ...] = ()
    checked_steps: int = 0
    #: the linear weights (of ``shapes``) whose kernels differ already at two rows: they run
    #: row by row in the exact steps
    row_by_row: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        return self.reason is None and self.rows >= 2

    def off(self, reason: str) -> ExactMode:
        """This result, switched off for ``reason``."""
        return replace(self, reason=reason)

    def describe(self) -> str:
        """One line for ``memeval bench`` and the decode statistics."""
        if self.on:
            return (
                f"on: up to {self.rows} rows per step, {self.checked_steps} calibration steps "
                "bit-identical to the reference call"
            )
        return f"off: {self.reason or f'{self.rows} rows per step'}"

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict; :meth:`from_dict` reads it back equal."""
        return {
            "rows": self.rows,
            "reason": self.reason,
            "shapes": list(self.shapes),
            "checked_steps": self.checked_steps,
            "row_by_row": list(self.row_by_row),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ExactMode:
        """The result :meth:`to_dict` wrote; ``ValueError`` naming what is wrong."""
        rows, reason = data.get("rows"), data.get("reason")
        shapes, checked = data.get("shapes", []), data.get("checked_steps", 0)
        row_by_row = data.get("row_by_row", [])
        counts = (rows, checked)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise ValueError("exact mode: 'rows' and 'checked_steps' must be counts")
        if reason is not None and not isinstance(reason, str):
            raise ValueError("exact mode: 'reason' must be a string or null")
        for strings in (shapes, row_by_row):
            if not isinstance(strings, list) or not all(isinstance(v, str) for v in strings):
                raise ValueError("exact mode: 'shapes' and 'row_by_row' must be lists of strings")
        assert isinstance(rows, int) and isinstance(checked, int)
        assert isinstance(shapes, list) and isinstance(row_by_row, list)
        return cls(rows, reason, tuple(shapes), checked, tuple(row_by_row))


@dataclass(frozen=True)
class Calibration:
    """What one calibration measured: plain data, separate from the code that measures it
    (``calibration.py``), so that it can be stored (:meth:`to_dict`, :meth:`from_dict`:
    JSON-able) and given to :class:`Bounds` or another decoder of the same model."""

    #: what the measurements depend on besides the weights: a calibration is valid only
    #: under the same setting
    setting: Setting
    #: turns run by the reference call to measure
    turns: int
    measured: Mapping[Kind, Disagreement] = field(default_factory=dict)
    #: whether the exact stage is on for this model and settings (``None``: not decided)
    exact: ExactMode | None = None

    def disagreement(self, kind: Kind) -> Disagreement:
        """What was measured for ``kind`` (empty where nothing was)."""
        return self.measured.get(kind, Disagreement())

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict; :meth:`from_dict` reads it back equal."""
        return {
            "setting": dict(self.setting),
            "turns": self.turns,
            "measured": {
                kind: {"absolute": list(d.absolute), "ulps": list(d.ulps)}
                for kind, d in self.measured.items()
            },
            "exact": None if self.exact is None else self.exact.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Calibration:
        """The calibration :meth:`to_dict` wrote; ``ValueError`` naming what is wrong."""
        setting, turns, measured = data.get("setting"), data.get("turns"), data.get("measured")
        if not isinstance(setting, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (str, int)))
            for k, v in setting.items()
        ):
            raise ValueError("calibration: 'setting' must map names to strings, integers or null")
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 0:
            raise ValueError("calibration: 'turns' must be a count")
        if not isinstance(measured, dict):
            raise ValueError("calibration: 'measured' must map kinds to measurements")
        kinds: dict[Kind, Disagreement] = {}
        for kind, values in measured.items():
            if kind not in KINDS or not isinstance(values, dict):
                raise ValueError(f"calibration: unknown kind {kind!r} or not an object")
            kinds[cast(Kind, kind)] = Disagreement(
                _floats(values.get("absolute"), f"measured.{kind}.absolute"),
                _floats(values.get("ulps"), f"measured.{kind}.ulps"),
            )
        exact = data.get("exact")
        if exact is not None and not isinstance(exact, dict):
            raise ValueError("calibration: 'exact' must be an object or null")
        return cls(
            dict(setting), turns, kinds, None if exact is None else ExactMode.from_dict(exact)
        )


class Bounds:
    """The bound of each kind of decision, and whether a decision is trusted.

    Policy: the model's ``dtype`` and the device kind it runs on (the floor, see
    :func:`calibrated_bound`), and a ``margin`` when the caller fixes one (then every kind
    keeps it, whatever is measured). Measurements: the :class:`Calibration` in use
    (:attr:`calibration`, ``None`` until one is given: the bounds are then
    :func:`default_margin`'s, or ``margin``).
    """

    def __init__(
        self,
        dtype: str,
        device_type: str = "cpu",
        *,
        margin: float | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.dtype = dtype
        self.device_type = device_type
        #: True when the caller fixed the margin: measurements never change the bounds
        self.fixed = margin is not None
        fixed = default_margin(dtype) if margin is None else float(margin)
        #: per kind: the absolute bound (fp32 units) ...
        self.absolute: dict[Kind, float] = dict.fromkeys(KINDS, fixed)
        #: ... and the relative one (16-bit): a margin of at least this many ulps of the
        #: decision's top logit (0: none)
        self.ulps: dict[Kind, float] = dict.fromkeys(KINDS, 0.0)
        self.calibration: Calibration | None = None
        if calibration is not None:
            self.use(calibration)

    def use(self, calibration: Calibration) -> None:
        """Take ``calibration``'s measurements; unless the margin is fixed, each kind's
        bound becomes :func:`calibrated_bound` of them."""
        self.calibration = calibration
        if self.fixed:
            return
        for kind in KINDS:
            measured = calibration.disagreement(kind)
            self.absolute[kind], self.ulps[kind] = calibrated_bound(
                self.dtype, kind, measured.absolute, measured.ulps, self.device_type
            )

    def disagreement(self, kind: Kind) -> Disagreement:
        """What the calibration in use measured for ``kind`` (empty without one)."""
        return Disagreement() if self.calibration is None else self.calibration.disagreement(kind)

    def trusted(self, kind: Kind, margin: float, top: float) -> bool:
        """Whether a greedy decision with this top-1/top-2 ``margin`` and top logit ``top``
        is far enough from a tie that the reference computation makes it too (exactly at
        the bound is trusted)."""
        bound = self.absolute[kind]
        if self.ulps[kind]:
            bound = max(bound, self.ulps[kind] * ulp(top, self.dtype))
        return margin >= bound

    @property
    def smallest(self) -> float:
        """The smallest absolute bound in use."""
        return min(self.absolute.values())

    @property
    def relative(self) -> bool:
        """True when some bound is counted in ulps of the top logit (16-bit)."""
        return any(self.ulps.values())
