"""The fast decoder: one teacher-forced forward pass per scenario, ``generate`` only where needed.

Every assistant message is predicted from the teacher-forced history, so the prompt of turn
``k`` is a token prefix of the whole conversation (checked per scenario). One forward pass
over the conversation therefore gives, at every position, the logits the reference path's
``generate`` sees at its first step, and at the later answer positions the logits it would
see *if* it had produced the truth so far. Greedy decoding reproduces the truth exactly when
the argmax at each answer position is the truth token and the argmax after it is a stop id;
then the prediction is the truth, decoded as the reference decodes it. At every other turn a
verification pass (one batched cached forward pass over a guessed continuation of the turn)
settles what it can, and a real greedy ``generate`` the rest, from the prefix's key/value
cache (cropped out of the forward pass, so the history is not re-run).

"Exact" means: the same outputs as :class:`~pytest_memeval.decode.reference.ReferenceDecoder`
for every turn, as long as no greedy decision of either path is a near tie. Two computations
of the same logits (batched vs single, cached vs prefilled) differ by rounding; a decision
whose top-1/top-2 margin (fp32) is below the bound for its kind is not trusted: a
teacher-forced check with such a margin is replaced by a real ``generate``, and a cached
``generate`` with such a margin at any step by the reference call itself. Where the argument
cannot hold the decoder says so in ``Rollout.notes`` and decodes the scenario with the
reference path. See ``docs/decoding.md``.

The package is the decoder's stages, one module each, in the order a scenario meets them:

* ``rules.py``: how forward passes are composed, by device kind and dtype (the batching
  rules, each with the measurement behind it);
* ``plan.py``: what a scenario must reproduce (prompts, expected tokens), or why the fast
  argument does not hold for it;
* ``bounds.py``: when a greedy decision is trusted (the margin guard, and the calibration
  data it is set from);
* ``forward.py``: the teacher-forced batch pass and what it proves;
* ``kvcache.py``: cache slicing and packing for the passes that continue a turn;
* ``verify.py`` (with ``answers.py``, its guesses): the verification rounds and their two
  computations;
* ``generate.py``: pooled cached ``generate`` for the rest;
* ``probe.py``: which linear kernels batch rows exactly (the exact stage's precondition);
* ``exact.py``: in exact mode, instead of verify and generate, the pending turns decoded in
  batched single-token steps, continued from the forward pass's cache (each decision read
  with the ``row_step`` bound), and from the reference's own prefill, bit for bit, where one
  is a near tie;
* ``calibration.py``: measuring the fast path's computations against the reference call;
* ``stored.py``: calibrations kept in the cache directory, measured once per model and
  setting and reused by later runs and other workers;
* ``decoder.py``: :class:`FastDecoder`, which runs plan -> forward -> verify -> generate,
  with the calibration as one step;
* ``episodes.py``: :class:`FastPolicy`, the closed loop's policy: each episode's cache kept
  across steps, the episodes' steps batched, ``generate.py``'s call and guard;

and the helpers the stages share: ``logits.py`` (greedy checks read off logits),
``stats.py`` (typed counters and seconds) and ``shared.py`` (what one decoder's stages
share: the model, the token budget, the bounds, the counters).
"""

from __future__ import annotations

from pytest_memeval.decode.fast.answers import AnswerIndex
from pytest_memeval.decode.fast.bounds import (
    KINDS,
    MANTISSA_BITS,
    MARGINS,
    MIN_MARGINS,
    PRIOR_ULPS,
    SAFETY,
    Bounds,
    Calibration,
    Disagreement,
    ExactMode,
    Kind,
    calibrated_bound,
    default_margin,
    summarize,
    ulp,
)
from pytest_memeval.decode.fast.calibration import CALIBRATION_TURNS
from pytest_memeval.decode.fast.decoder import (
    DEFAULT_ACCELERATOR_BATCH_SIZE,
    DEFAULT_BATCH_SIZES,
    DEFAULT_MAX_BATCH_TOKENS,
    FastDecoder,
)
from pytest_memeval.decode.fast.episodes import CALIBRATION_STEPS, EPISODES_TOGETHER, FastPolicy
from pytest_memeval.decode.fast.exact import ExactStage
from pytest_memeval.decode.fast.generate import (
    GENERATE_LOGITS_BYTES,
    GENERATE_ROWS,
    GenerateCall,
    GenerateRow,
    Generator,
)
from pytest_memeval.decode.fast.kvcache import CacheSlice
from pytest_memeval.decode.fast.logits import Checks
from pytest_memeval.decode.fast.plan import ScenarioPlan, unsafe_generation_settings
from pytest_memeval.decode.fast.probe import probe_linear_rows
from pytest_memeval.decode.fast.rules import (
    ACCELERATOR,
    CPU,
    FORWARD_MIN_FILL,
    BatchingRules,
    batching_rules,
    device_kind,
)
from pytest_memeval.decode.fast.shared import Shared
from pytest_memeval.decode.fast.stats import ClosedLoopStats, DecodeStats, StageSeconds
from pytest_memeval.decode.fast.stored import (
    STORE_FORMAT,
    CalibrationCacheWarning,
    CalibrationOutcome,
    CalibrationStore,
    StoredCalibration,
    weight_fingerprints,
)
from pytest_memeval.decode.fast.verify import Acceptance, Continuation, accept

__all__ = [
    "ACCELERATOR",
    "CALIBRATION_STEPS",
    "CALIBRATION_TURNS",
    "CPU",
    "DEFAULT_ACCELERATOR_BATCH_SIZE",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_BATCH_TOKENS",
    "EPISODES_TOGETHER",
    "FORWARD_MIN_FILL",
    "GENERATE_LOGITS_BYTES",
    "GENERATE_ROWS",
    "KINDS",
    "MANTISSA_BITS",
    "MARGINS",
    "MIN_MARGINS",
    "PRIOR_ULPS",
    "SAFETY",
    "STORE_FORMAT",
    "Acceptance",
    "AnswerIndex",
    "BatchingRules",
    "Bounds",
    "CacheSlice",
    "Calibration",
    "CalibrationCacheWarning",
    "CalibrationOutcome",
    "CalibrationStore",
    "Checks",
    "ClosedLoopStats",
    "Continuation",
    "DecodeStats",
    "Disagreement",
    "ExactMode",
    "ExactStage",
    "FastDecoder",
    "FastPolicy",
    "GenerateCall",
    "GenerateRow",
    "Generator",
    "Kind",
    "ScenarioPlan",
    "Shared",
    "StageSeconds",
    "StoredCalibration",
    "accept",
    "batching_rules",
    "calibrated_bound",
    "default_margin",
    "device_kind",
    "probe_linear_rows",
    "summarize",
    "ulp",
    "unsafe_generation_settings",
    "weight_fingerprints",
]
