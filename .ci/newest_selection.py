"""Which tests the newest-releases step of ``.ci/run`` reruns, from what the releases changed.

``python .ci/newest_selection.py OTHER_PYTHON``: compares OTHER_PYTHON's environment (the
newest-releases venv) with this one (where the main suite just ran) and prints, on stdout, one
test path per line to rerun there; on stderr, each difference and what it reruns. Nothing on
stdout means the step has nothing new to test.

The step exists to catch the releases that break ``pytest_memeval/compat/`` (every use of
another package's private API) or a behaviour the plugin relies on. The main suite already ran
every test on this environment's releases, so a module is run again only where a release it
exercises differs:

- any difference at all (or another Python) reruns the unit tests and the bundled contracts
  (about a minute on 2 cores);
- each group below reruns its modules when one of its distributions differs (a distribution
  missing from one side counts as a difference).

A distribution in no group (a test-only dependency, a dependency of a dependency) reruns the
first set only. The project itself, an editable install of this checkout on both sides, is
left out: it is the code under test, the same files in both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

_LIST = (
    "import json, sys, importlib.metadata as m; "
    "print(json.dumps({'python': sys.version, 'dists': "
    "{d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}}))"
)
PROJECT = "pytest-memeval"
ALWAYS = ("tests/unit", "contracts")


@dataclass(frozen=True)
class Group:
    """Distributions, and the test modules that exercise what the plugin uses of them."""

    name: str
    distributions: frozenset[str]
    tests: tuple[str, ...]


GROUPS = (
    # compat/pytest.py, compat/xdist.py, compat/syrupy.py; pytest-html's summary cell and the
    # report pages (jinja2, markupsafe); the JUnit file junitxml writes.
    Group(
        "pytest",
        frozenset(
            {
                "pytest",
                "pluggy",
                "iniconfig",
                "packaging",
                "pygments",
                "pytest-xdist",
                "execnet",
                "syrupy",
                "pytest-html",
                "pytest-metadata",
                "jinja2",
                "markupsafe",
            }
        ),
        (
            "tests/integration/test_compat_xdist.py",
            "tests/integration/test_scheduling.py",
            "tests/integration/test_options.py",
            "tests/integration/test_guards.py",
            "tests/integration/test_e2e.py",
            "tests/integration/test_power_and_pairs.py",
            "tests/integration/test_junit.py",
            "tests/integration/test_gate.py::test_demo_model_gate_decides_and_html_shows_it",
        ),
    ),
    # compat/transformers.py, attention.py, row_attention.py, segment_attention.py: the fast
    # decode path's chat-template shortcut, cache cropping and attention switch on every model
    # family, the verification pass's cache cut, device binding; chat templates render in
    # jinja2; GGUF files are read by gguf.
    Group(
        "model",
        frozenset(
            {
                "torch",
                "transformers",
                "peft",
                "tokenizers",
                "safetensors",
                "huggingface-hub",
                "accelerate",
                "jinja2",
                "gguf",
            }
        ),
        (
            "tests/integration/test_fast_decode.py",
            "tests/integration/test_fast_batches.py",
            "tests/integration/test_fast_verify.py",
            "tests/integration/test_families.py",
            "tests/integration/test_devices.py",
            "tests/integration/test_e2e.py",
        ),
    ),
    # compat/textworld_express.py: the JVM process behind the closed loop's environment.
    Group(
        "environment",
        frozenset({"textworld-express", "py4j", "gymnasium"}),
        ("tests/integration/test_env_textworld.py",),
    ),
)


@dataclass(frozen=True)
class Selection:
    """What differs (one line each), why each group is or is not rerun (its differing
    distributions, or ``python``; empty: not rerun) and the test paths to rerun, in order,
    each once."""

    differences: tuple[str, ...]
    reasons: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]


def installed(python: str) -> dict[str, object]:
    """The interpreter's version and its distributions, name to version."""
    out = subprocess.run([python, "-I", "-c", _LIST], check=True, capture_output=True, text=True)
    data: dict[str, object] = json.loads(out.stdout)
    return data


def _dists(env: dict[str, object]) -> dict[str, str]:
    dists = env["dists"]
    assert isinstance(dists, dict)
    return dists


def differences(tested: dict[str, object], other: dict[str, object]) -> dict[str, str]:
    """What ``other`` has that ``tested`` did not test: the distribution (or ``python``) to
    a line saying how it differs."""
    found = {}
    if tested["python"] != other["python"]:
        found["python"] = f"python {other['python']!r} (tested {tested['python']!r})"
    mine, theirs = _dists(tested), _dists(other)
    for name in sorted(set(mine) | set(theirs)):
        if name == PROJECT or mine.get(name) == theirs.get(name):
            continue
        if name not in theirs:  # the lint tools live in the main environment only
            continue
        found[name] = f"{name} {theirs[name]} (tested: {mine.get(name, 'not installed')})"
    return found


def _reason(group: Group, changed: set[str]) -> tuple[str, ...]:
    """Why ``group`` reruns: its distributions that differ (every group on another Python)."""
    return tuple(sorted(changed & group.distributions)) or (
        ("python",) if "python" in changed else ()
    )


def select(tested: dict[str, object], other: dict[str, object]) -> Selection:
    """The tests to rerun on ``other`` after the main suite ran on ``tested``."""
    found = differences(tested, other)
    if not found:
        return Selection((), {}, ())
    reasons = {group.name: _reason(group, set(found)) for group in GROUPS}
    tests = list(ALWAYS)
    for group in GROUPS:
        if reasons[group.name]:
            tests += [t for t in group.tests if t not in tests]
    return Selection(tuple(found.values()), reasons, tuple(tests))


def main(argv: list[str]) -> int:
    other = installed(argv[1])
    selection = select(installed(sys.executable), other)
    if not selection.differences:
        count = len(_dists(other))
        print(
            f"the newest releases the pins allow are the {count} distributions the main suite "
            "just ran on, each at the same version: nothing new to test",
            file=sys.stderr,
        )
        return 0
    print(
        f"the newest releases differ from those tested in {len(selection.differences)} "
        "distribution(s):",
        file=sys.stderr,
    )
    for line in selection.differences:
        print(f"  {line}", file=sys.stderr)
    for name, why in selection.reasons.items():
        verdict = f"rerun ({', '.join(why)} differ)" if why else "same releases: not rerun"
        print(f"{name} modules: {verdict}", file=sys.stderr)
    print("\n".join(selection.tests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
