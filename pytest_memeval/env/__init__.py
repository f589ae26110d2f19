"""Environments a model acts in (the closed loop): the protocol, specs, backends, episodes.

Plain Python, no torch: the protocol (:mod:`.protocol`: Gymnasium's ``reset``/``step``/
``close`` with text and a typed info), a profile's ``env`` table (:mod:`.spec`), the built-in
backends (:mod:`.textworld`: TextWorld Express; :mod:`.gym_adapter`: any Gymnasium env with
text), which of them a spec gets (:mod:`.registry`), one episode of a policy in an environment
(:mod:`.episode`), and one environment for a process's episodes (:mod:`.runner`). Imports
only :mod:`pytest_memeval.compat`; optional packages (textworld_express, gymnasium) only when
a backend is made. See docs/closed-loop.md.
"""

from pytest_memeval.env.episode import (
    BatchPolicy,
    ContextLimitExceeded,
    Episode,
    Message,
    Policy,
    PolicyOutput,
    StepRecord,
    TerminationReason,
    run_episode,
    run_episodes,
)
from pytest_memeval.env.gym_adapter import GymnasiumTextEnv
from pytest_memeval.env.protocol import (
    EnvError,
    EnvInfo,
    EnvSetupError,
    EnvSpecError,
    StepResult,
    TextEnv,
)
from pytest_memeval.env.registry import BUILTIN_BACKENDS, describe_env, make_env
from pytest_memeval.env.runner import EpisodeRunner
from pytest_memeval.env.spec import (
    DEFAULT_MAX_STEPS,
    MAX_SEEDS,
    EnvSpec,
    parse_env_spec,
    parse_seeds,
)
from pytest_memeval.env.textworld import TextWorldExpress

__all__ = [
    "BUILTIN_BACKENDS",
    "DEFAULT_MAX_STEPS",
    "MAX_SEEDS",
    "BatchPolicy",
    "ContextLimitExceeded",
    "EnvError",
    "EnvInfo",
    "EnvSetupError",
    "EnvSpec",
    "EnvSpecError",
    "Episode",
    "EpisodeRunner",
    "GymnasiumTextEnv",
    "Message",
    "Policy",
    "PolicyOutput",
    "StepRecord",
    "StepResult",
    "TerminationReason",
    "TextEnv",
    "TextWorldExpress",
    "describe_env",
    "make_env",
    "parse_env_spec",
    "parse_seeds",
    "run_episode",
    "run_episodes",
]
