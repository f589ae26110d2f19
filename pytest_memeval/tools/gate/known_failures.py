"""Known failures: the eval items a reference run failed, as a set of item names.

``--memeval-expect RUN|FILE`` marks these items ``xfail(strict=False)``, so a run fails only
on *new* failures and a fixed scenario shows as XPASS. The set comes from

* a run directory (it must pass the recount): ``test_final_query[<id>]`` for each scenario
  whose final answer was wrong, ``test_turns[<id>]`` for each aligned scenario with a wrong
  turn;
* a ``predictions.jsonl`` file (the same, without the metrics check);
* a text file of item names, one per line, ``#`` comments allowed: the file to commit, as
  written by ``memeval known-failures RUN -o FILE``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from pytest_memeval.core.history import history_of, history_words
from pytest_memeval.core.ids import item_name, split_item_name
from pytest_memeval.core.records import Record, RecordError, read_records
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.core.rundir import PREDICTIONS, atomic_write

__all__ = [
    "ExpectError",
    "cli_arguments",
    "cli_main",
    "failed_items",
    "load_known_failures",
]


class ExpectError(ValueError):
    """The known-failures source is unusable; the message names the file (and line)."""


def failed_items(records: Iterable[Record]) -> list[str]:
    """Names of the standard eval items that failed, in record order.

    Names hold pytest ids (:func:`pytest_memeval.core.ids.item_name`), as pytest names the
    items: a scenario id such as ``café #1`` would not survive a text file with ``#``
    comments, nor match.
    """
    names: list[str] = []
    for rec in records:
        if rec["final_match"] is not True:
            names.append(item_name("test_final_query", rec["id"]))
        if rec["aligned"] is True and any(t["match"] is False for t in rec["turns"]):
            names.append(item_name("test_turns", rec["id"]))
    return names


def _from_text(path: Path) -> list[str]:
    names: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectError(f"{path}: cannot read known failures: {exc}") from None
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = split_item_name(line)  # an item name or a full node id
        # Eval item names hold pytest ids (ids.param_id): never whitespace.
        if parts is None or any(ch.isspace() for ch in parts[1]):
            raise ExpectError(
                f"{path}:{lineno}: not an eval item name (expected e.g. "
                f"'test_final_query[s0001]'): {raw.strip()!r}"
            )
        names.append(f"{parts[0]}[{parts[1]}]")
    return names


def _one_history(records: Iterable[Record], history: str, source: Path) -> Iterable[Record]:
    """``records``, refusing one predicted with another history than ``history``: the known
    failures of a teacher-forced run are not those of a free-running one."""
    for rec in records:
        if history_of(rec) != history:
            raise ExpectError(
                f"{source}: scenario {rec['id']!r} was evaluated {history_words(history_of(rec))}"
                f" (history {history_of(rec)}), this run is {history_words(history)} "
                f"(--memeval-history {history}); use the known failures of a run of the same "
                "history"
            )
        yield rec


def load_known_failures(source: Path, history: str | None = None) -> list[str]:
    """The known-failure item names of a run directory, predictions file or text list.

    ``history``: the run's (``truth`` or ``model``); records of another history are refused.
    A text list says nothing of its history and is taken as given."""
    if source.is_dir():
        try:
            recount_run(source)
        except RecountError as exc:
            raise ExpectError(f"{source}: reference run fails the recount: {exc}") from None
        source = source / PREDICTIONS
    elif not source.is_file():
        raise ExpectError(f"{source}: no such run directory or known-failures file")
    if source.suffix == ".jsonl":
        try:
            records = read_records(source)
            if history is not None:
                records = iter(_one_history(records, history, source))
            return failed_items(records)
        except RecordError as exc:  # names the file, line, scenario and field already
            raise ExpectError(f"unusable known failures: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ExpectError(f"{source}: unreadable predictions: {exc}") from None
    return _from_text(source)


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``memeval known-failures``."""
    parser.add_argument("run", type=Path, metavar="RUN", help="reference run directory")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="write the list here (default: stdout)"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Print (or write) the reference run's failing eval items, one per line."""
    try:
        names = load_known_failures(args.run)
    except ExpectError as exc:
        print(f"memeval known-failures: {exc}", file=sys.stderr)
        return 2
    text = (
        f"# eval items that failed in {args.run}; use with pytest --memeval-expect FILE\n"
        + "".join(f"{name}\n" for name in names)
    )
    if args.output is None:
        sys.stdout.write(text)
    else:
        atomic_write(args.output, [text])
        print(f"memeval known-failures: {len(names)} item(s) written to {args.output}")
    return 0
