"""Whether a second environment holds exactly the releases the first one tested.

``python .ci/same_versions.py OTHER_PYTHON``: exit 0 when every distribution installed in
OTHER_PYTHON's environment (the newest-releases venv of .ci/run) is installed in this one at
the same version, and the two interpreters are the same Python; exit 1, listing each
difference, otherwise. The project itself (an editable install of this checkout in both) is
left out: it is the code under test, the same files in both.

The newest-releases step exists to run the tests on releases the main suite did not run
on. Where the main environment was itself installed fresh (a clean CI machine resolves every
requirement to its newest allowed release), the two are identical and running the suite
again would test nothing new; this says so, with the list, instead of spending the time.
"""

from __future__ import annotations

import json
import subprocess
import sys

_LIST = (
    "import json, sys, importlib.metadata as m; "
    "print(json.dumps({'python': sys.version, 'dists': "
    "{d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}}))"
)
PROJECT = "pytest-memeval"


def installed(python: str) -> dict[str, object]:
    """The interpreter's version and its distributions, name to version."""
    out = subprocess.run([python, "-I", "-c", _LIST], check=True, capture_output=True, text=True)
    data: dict[str, object] = json.loads(out.stdout)
    return data


def differences(tested: dict[str, object], other: dict[str, object]) -> list[str]:
    """What ``other`` has that ``tested`` did not test: one line each."""
    lines = []
    if tested["python"] != other["python"]:
        lines.append(f"python {other['python']!r} (tested {tested['python']!r})")
    mine = tested["dists"]
    assert isinstance(mine, dict)
    theirs = other["dists"]
    assert isinstance(theirs, dict)
    for name, version in sorted(theirs.items()):
        if name == PROJECT:
            continue
        if mine.get(name) != version:
            lines.append(f"{name} {version} (tested: {mine.get(name, 'not installed')})")
    return lines


def main(argv: list[str]) -> int:
    other = installed(argv[1])
    lines = differences(installed(sys.executable), other)
    if lines:
        print(f"the newest releases differ from those tested in {len(lines)} distribution(s):")
        for line in lines:
            print(f"  {line}")
        return 1
    count = len(other["dists"]) if isinstance(other["dists"], dict) else 0
    print(
        f"the newest releases the pins allow are the {count} distributions the main suite "
        "just ran on, each at the same version: nothing new to test"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
