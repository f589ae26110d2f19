"""The closed-loop demo's data: TextWorld Express ``twc`` gold paths as training records.

The bundled ``twc_gold`` builder (``pytest_memeval/core/builders/twc_gold.py``) plays each
seed's gold path in the real environment and renders it as a conversation: the task
description as the system message, observations as user turns, gold actions as assistant
turns, and a final scene question (``query = "opened"``: which container was opened, or where
an object was put when none was). This script only writes what the builder returns, so the
adapter trained on it sees the prompts the plugin evaluates with, teacher-forced, free-running
and in the closed loop (the same ``observation.strip()`` user turns).

Writes ``demo/data/twc/train.jsonl``: seeds ``0..N-1`` of the environment's *train* fold
(the benchmark the demo profiles evaluate is the *test* fold, built at run time, never
trained on). ``demo/train.py --base smollm2 --variant twc`` trains on it.

Usage::

    python demo/make_twc_data.py                 # the committed file: train seeds 0-329
    python demo/make_twc_data.py --seeds 0-9 --out /tmp/twc.jsonl

Needs ``textworld-express`` and Java 17 (the closed loop's environment).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pytest_memeval.core.benchmark import dump_record, from_records  # noqa: E402
from pytest_memeval.core.builders import build_bundled  # noqa: E402

#: one room, two objects, no doors: the closed-loop demo's game (demo/closed_loop.py)
TWC = "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0"
QUERY = "opened"


def main(argv: Sequence[str] | None = None) -> int:
    """Build the train-fold records and write them, one JSON object a line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-329", help="train-fold seeds (default 0-329)")
    parser.add_argument("--params", default=TWC)
    parser.add_argument("--out", type=Path, default=ROOT / "demo" / "data" / "twc" / "train.jsonl")
    args = parser.parse_args(argv)
    options = {"params": args.params, "fold": "train", "seeds": args.seeds, "query": QUERY}
    built = build_bundled("twc_gold", options, ROOT)
    assert built is not None  # a bundled builder
    records = list(built)
    from_records(records, "twc_gold (train fold)")  # validated before anything is written
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(dump_record(dict(r)) for r in records), encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
