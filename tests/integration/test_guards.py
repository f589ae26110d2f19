"""Byte guards: failure messages of the pure checks, and pytester projects that copy a few demo
records and the demo tokenizer, record snapshots, then mutate one thing each.

Every mutation must fail exactly the guards that cover it, with a message naming the scenario
and the place; the untouched tree must pass, with and without xdist, and no run may lose or
rewrite a snapshot it should not.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import dump_record
from pytest_memeval.guards.checks import (
    GuardError,
    PromptTokens,
    check_prefix,
    check_reference_file,
    check_reference_line,
    describe_byte_difference,
    describe_token_difference,
    load_guard_specs,
    parse_tokens,
    read_reference,
    serialize_tokens,
)

from ..conftest import BASE_MODEL, DEMO, run_forked

N = 4  # scenarios per variant in the pytester projects
GUARD_MODULE = "test_project_guards"  # not test_guards: the repo's own module has that name
SNAPSHOTS = Path("__snapshots__") / GUARD_MODULE


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the common prefix, computed independently of the code under test."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def demo_lines(variant: str, n: int = N) -> list[bytes]:
    """The first ``n`` lines of a demo training-format file, as bytes (line ends kept)."""
    with (DEMO / "data" / variant / "val.jsonl").open("rb") as fh:
        return [line for _, line in zip(range(n), fh, strict=False)]


# --------------------------------------------------------------------------- pure checks
def test_byte_difference_names_offset_and_both_contexts() -> None:
    a = b'{"id": "s1", "content": "pick mug from counter"}\n'
    b = a.replace(b"from", b"frum")
    lines = describe_byte_difference(a, b, expected_label="reference", actual_label="built")
    offset = a.index(b"from") + 2
    assert lines[0].startswith(f"first differing byte at offset {offset}")
    assert "reference: " in lines[1] and "from counter" in lines[1]
    assert "built    : " in lines[2] and "frum counter" in lines[2]
    # The caret sits under the differing byte of both context lines.
    caret = lines[3].index("^")
    assert lines[1][caret] == "o" and lines[2][caret] == "u"


def test_reference_line_names_scenario_message_and_offset(tmp_path: Path) -> None:
    line = demo_lines("baseline", 1)[0]
    record = json.loads(line)
    k = next(i for i, m in enumerate(record["messages"]) if m["role"] == "assistant")
    record["messages"][k]["content"] += "!"
    built = dump_record(record).encode("utf-8")
    ref = tmp_path / "val.jsonl"
    ref.write_bytes(line)
    message = check_reference_line("baseline", record["id"], built, read_reference(ref))
    assert message is not None
    offset = common_prefix_len(line, built)
    assert f"baseline scenario {record['id']!r}" in message
    assert f"{ref}:1" in message
    assert f"messages[{k}] (assistant) differs" in message
    assert f"first differing byte at offset {offset} of the line" in message
    assert check_reference_line("baseline", record["id"], line, read_reference(ref)) is None


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda ls: [ls[1], ls[0], *ls[2:]], "scenario order differs"),
        (lambda ls: [x.replace(b"\n", b"\r\n") for x in ls], "end with CRLF (first: line 1)"),
        (lambda ls: ls[:-1], "1 scenario(s) only in the build"),
        (lambda ls: [*ls, ls[-1]], "duplicate scenario id(s)"),
        (lambda ls: [ls[0].rstrip(b"\n"), *ls[1:]][:1], "no final newline"),
    ],
    ids=["reordered", "crlf", "missing", "duplicate", "no-final-newline"],
)
def test_reference_file_explains_framing_and_order(
    tmp_path: Path, mutate: object, expected: str
) -> None:
    lines = demo_lines("oracle", 3)
    built = [(json.loads(x)["id"], x) for x in lines]
    ref = tmp_path / "val.jsonl"
    ref.write_bytes(b"".join(lines))
    assert check_reference_file("oracle", built, read_reference(ref)) is None
    ref.write_bytes(b"".join(mutate(lines)))  # type: ignore[operator]
    message = check_reference_file("oracle", built, read_reference(ref))
    assert message is not None and expected in message, message


def _tokens(conversation: tuple[int, ...], *prompts: tuple[int, tuple[int, ...]]) -> PromptTokens:
    vocab = {1: "<s>", 2: "<|user|>", 3: "<|assistant|>", 4: "hi", 5: "yes", 6: "<|eot|>", 0: "?"}
    return PromptTokens("s9", conversation, prompts, vocab)


def test_prefix_property_doubled_bos_and_unknown_token() -> None:
    conv = (1, 2, 4, 6, 3, 5, 6, 2, 4, 6, 3, 5, 6)
    good = _tokens(conv, (2, conv[:5]), (4, conv[:11]))
    assert check_prefix("v", good, unk_token_id=0, bos_token_id=1) is None

    broken = _tokens(conv, (2, (*conv[:5], 6)), (4, conv[:11]))
    message = check_prefix("v", broken)
    assert message is not None
    assert (
        "the prompt of turn 0 (messages[2]) is not a token prefix of the prompt of the final "
        in message
    )
    assert "first difference at token 5: 6 '<|eot|>' vs 5 'yes'" in message

    doubled = _tokens((1, *conv), (2, (1, *conv[:5])), (4, (1, *conv[:11])))
    message = check_prefix("v", doubled, bos_token_id=1)
    assert message is not None and "starts with a doubled BOS token (1 '<s>' twice)" in message

    unknown = _tokens((*conv[:8], 0, *conv[9:]), (2, conv[:5]), (4, (*conv[:8], 0, *conv[9:11])))
    message = check_prefix("v", unknown, unk_token_id=0)
    assert message is not None and "contains the unknown token at position 8" in message


def test_token_snapshot_round_trips_and_explains_a_changed_separator() -> None:
    conv = (2, 4, 6, 3, 5, 6, 2, 4, 6, 3, 5, 6)
    tokens = _tokens(conv, (3, conv[:4]), (9, (*conv[:9], 6)))
    data = serialize_tokens(tokens, "v")
    parsed = parse_tokens(data)
    assert parsed.conversation == conv
    assert parsed.prompts == {3: conv[:4], 9: (*conv[:9], 6)}
    assert parsed.vocab[6] == "<|eot|>"
    # A template that doubles the end-of-turn separator: same text, different ids.
    doubled = (2, 4, 6, 6, 3, 5, 6, 6, 2, 4, 6, 6, 3, 5, 6, 6)
    changed = serialize_tokens(_tokens(doubled, (3, doubled[:5]), (11, doubled[:12])), "v")
    lines = describe_token_difference(data, changed)
    assert lines[0].startswith("conversation token 3 differs: snapshot 3 '<|assistant|>', now 6")
    assert any("prompt(s) differ" in line for line in lines)


def test_guard_tables_errors_name_file_table_and_key(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.memeval.guards.v]\nsnapshot = ["bytes"]\n', encoding="utf-8")
    with pytest.raises(GuardError, match=r"pyproject.toml: \[tool.memeval.guards.v\]: 'snapshot'"):
        load_guard_specs(path)
    path.write_text("[tool.memeval.guards.v]\nrefrence = 'x'\n", encoding="utf-8")
    with pytest.raises(GuardError, match=r"unknown key\(s\) \['refrence'\]"):
        load_guard_specs(path)
    path.write_text("[tool.memeval.guards.v]\nreference = 'data/v.jsonl'\n", encoding="utf-8")
    (spec,) = load_guard_specs(path)
    assert spec.profile == "v" and spec.reference == (tmp_path / "data/v.jsonl").resolve()
    assert spec.snapshot == () and spec.prefix


# --------------------------------------------------------------------------- projects
PYPROJECT = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider -p no:randomly"

[tool.memeval.ckpt.baseline]
model = "tok"
benchmark = {{ builder = "scene_memory", tasks = "data/tasks.jsonl" }}

[tool.memeval.ckpt.oracle]
model = "tok"

[tool.memeval.ckpt.oracle.benchmark]
builder = "scene_memory"
tasks = "data/tasks.jsonl"
init_state_manifest = "data/manifest.jsonl"

[tool.memeval.guards.baseline]
reference = "data/baseline.jsonl"
snapshot = ["records", "tokens"]

[tool.memeval.guards.oracle]
reference = "data/oracle.jsonl"
snapshot = ["tokens"]
{extra}
"""

GUARDS = """
from pytest_memeval.guard_tests import (  # noqa: F401
    test_prompt_prefix,
    test_prompt_tokens,
    test_record_snapshot,
    test_reference_bytes,
    test_reference_file,
    test_scenario_order,
)
"""

# reference: 2 files + 2N lines; snapshots: 1 order + N records + 2N tokens; prefix: 2N
N_ITEMS = 2 + 2 * N + 1 + N + 2 * N + 2 * N
N_SNAPSHOTS = 1 + N + 2 * N


def write_config(path: Path, extra: str = "") -> None:
    (path / "pyproject.toml").write_text(PYPROJECT.format(extra=extra), encoding="utf-8")


def write_project(path: Path) -> None:
    """Copy the first ``N`` demo tasks, their two reference files and the demo tokenizer."""
    data = path / "data"
    data.mkdir(exist_ok=True)
    with (DEMO / "data" / "tasks_val.jsonl").open("rb") as fh:
        (data / "tasks.jsonl").write_bytes(b"".join(x for _, x in zip(range(N), fh, strict=False)))
    shutil.copy(DEMO / "data" / "init_state_manifest.jsonl", data / "manifest.jsonl")
    (data / "baseline.jsonl").write_bytes(b"".join(demo_lines("baseline")))
    (data / "oracle.jsonl").write_bytes(b"".join(demo_lines("oracle")))
    tok = path / "tok"
    tok.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(BASE_MODEL / name, tok / name)
    write_config(path)
    (path / f"{GUARD_MODULE}.py").write_text(GUARDS, encoding="utf-8")


def reference_lines(project: Path, variant: str) -> list[bytes]:
    return (project / "data" / f"{variant}.jsonl").read_bytes().splitlines(keepends=True)


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def failures(result: pytest.RunResult) -> dict[str, str]:
    """Failed items of an in-process run: ``test name[param] -> failure text``."""
    _, _, failed = result.reprec.listoutcomes()  # type: ignore[attr-defined]
    return {r.nodeid.split("::")[-1]: r.longreprtext for r in failed}


@pytest.fixture(scope="module", autouse=True)
def _tokenizer_stack_loaded() -> None:
    """Render one prompt here first: pytester's in-process runs drop the modules they import,
    and numpy/tokenizers cannot be imported twice in one process."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(BASE_MODEL), local_files_only=True)
    tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    tok("hi", add_special_tokens=False)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One frozen copy of the project per module, so every test sees the same demo bytes
    (the demo data may be regenerated while the suite runs)."""
    path = tmp_path_factory.mktemp("guard-project")
    write_project(path)
    return path


@pytest.fixture
def project(pytester: pytest.Pytester, template: Path) -> Path:
    """A guarded project with its snapshots recorded (by ``--snapshot-update``, once)."""
    path = Path(pytester.path)
    shutil.copytree(template, path, dirs_exist_ok=True)
    if not (template / SNAPSHOTS).exists():
        result = pytester.runpytest_inprocess("--snapshot-update")
        assert result.ret == 0, result.stdout.str()
        assert len(list((path / SNAPSHOTS).iterdir())) == N_SNAPSHOTS
        shutil.copytree(path / SNAPSHOTS, template / SNAPSHOTS)
    return path


@pytest.mark.slow
def test_untouched_tree_passes(pytester: pytest.Pytester, project: Path) -> None:
    before = digest(project / SNAPSHOTS)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=N_ITEMS)
    assert digest(project / SNAPSHOTS) == before
    text = (project / SNAPSHOTS / "test_prompt_tokens[baseline-s0001].tokens").read_text("utf-8")
    assert text.startswith("# pytest-memeval prompt tokens v1\n")


@pytest.mark.slow
def test_changed_byte_in_the_harness_fails_reference_and_snapshot(
    pytester: pytest.Pytester, project: Path
) -> None:
    # A harness change that adds one space to one baseline message: the whitespace tokenizer
    # cannot see it, the byte guards must.
    pytester.makeconftest(
        """
        import pytest
        from pytest_memeval.core.builders import scene_memory

        @pytest.hookimpl(tryfirst=True)
        def pytest_memeval_build_benchmark(builder, options, rootdir):
            if builder != "scene_memory" or "init_state_manifest" in options:
                return None
            records = list(scene_memory.build(options, rootdir))
            records[1]["messages"][3]["content"] += " "
            return records
        """
    )
    original = reference_lines(project, "baseline")[1]
    record = json.loads(original)
    sid = record["id"]
    record["messages"][3]["content"] += " "
    offset = common_prefix_len(original, dump_record(record).encode("utf-8"))
    failed = failures(pytester.runpytest_inprocess())
    assert set(failed) == {
        "test_reference_file[baseline]",
        f"test_reference_bytes[baseline-{sid}]",
        f"test_record_snapshot[baseline-{sid}]",
    }
    message = failed[f"test_reference_bytes[baseline-{sid}]"]
    assert message.startswith(f"baseline scenario '{sid}': the built record differs from")
    assert "from the reference data/baseline.jsonl:2\n" in message
    assert "messages[3] (user) differs" in message
    assert f"first differing byte at offset {offset} of the line" in message
    assert "reference: " in message and "built    : " in message
    snap = failed[f"test_record_snapshot[baseline-{sid}]"]
    assert "changed since its snapshot" in snap and "messages[3] (user) differs" in snap
    assert f"pytest {GUARD_MODULE}.py --snapshot-update" in snap
    assert "1 scenario(s) differ byte-wise" in failed["test_reference_file[baseline]"]


@pytest.mark.slow
def test_changed_template_fails_token_guards(pytester: pytest.Pytester, project: Path) -> None:
    template = project / "tok" / "chat_template.jinja"
    text = template.read_text("utf-8")
    assert "' <|eot|> '" in text and "'<|assistant|>'" in text
    # A doubled end-of-turn separator (message text unchanged), and a generation prompt that
    # is no longer the start of the trained assistant turn.
    text = text.replace("' <|eot|> '", "' <|eot|> <|eot|> '")
    template.write_text(text.replace("'<|assistant|>'", "'<|assistant|> <|eot|>'"), "utf-8")
    failed = failures(pytester.runpytest_inprocess())
    ids = [json.loads(x)["id"] for x in reference_lines(project, "baseline")]
    expected = {
        f"{name}[{v}-{sid}]"
        for name in ("test_prompt_tokens", "test_prompt_prefix")
        for v in ("baseline", "oracle")
        for sid in ids
    }
    assert set(failed) == expected
    tokens = failed[f"test_prompt_tokens[baseline-{ids[0]}]"]
    assert "the prompt token ids changed since its snapshot" in tokens
    assert "conversation token" in tokens and "now 5 '<|eot|>'" in tokens
    prefix = failed[f"test_prompt_prefix[oracle-{ids[0]}]"]
    assert (
        "the prompt of turn 0 (messages[2]) is not a token prefix of the prompt of turn 1" in prefix
    )
    assert "'<|eot|>' vs" in prefix


@pytest.mark.slow
def test_partial_update_rewrites_only_the_selected_snapshot(
    pytester: pytest.Pytester, project: Path
) -> None:
    before = digest(project / SNAPSHOTS)
    template = project / "tok" / "chat_template.jinja"
    template.write_text(template.read_text("utf-8").replace("' <|eot|> '", "' <|eot|> <|eot|> '"))
    result = pytester.runpytest_inprocess("--snapshot-update", "-k", "tokens and baseline-s0002")
    result.assert_outcomes(passed=1)
    after = digest(project / SNAPSHOTS)
    assert set(after) == set(before)
    assert {n for n in before if before[n] != after[n]} == {
        "test_prompt_tokens[baseline-s0002].tokens"
    }


@pytest.mark.slow
def test_reordered_scenarios_fail_order_guards(pytester: pytest.Pytester, project: Path) -> None:
    tasks = project / "data" / "tasks.jsonl"
    lines = tasks.read_bytes().splitlines(keepends=True)
    tasks.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))
    first, second = (json.loads(x)["id"] for x in lines[:2])
    failed = failures(pytester.runpytest_inprocess())
    assert set(failed) == {
        "test_reference_file[baseline]",
        "test_reference_file[oracle]",
        "test_scenario_order[baseline]",
    }
    assert (
        f"scenario order differs: data/oracle.jsonl:1 holds '{first}' where "
        f"the build has '{second}'" in failed["test_reference_file[oracle]"]
    )
    assert (
        f"order differs at position 1: the snapshot has '{first}', the build '{second}'"
        in failed["test_scenario_order[baseline]"]
    )


@pytest.mark.slow
def test_changed_baseline_file_fails_reference_guard(
    pytester: pytest.Pytester, project: Path
) -> None:
    ref = project / "data" / "baseline.jsonl"
    lines = reference_lines(project, "baseline")
    needle = b'"content": "pick '
    at = lines[2].index(needle) + len(b'"content": "p')  # "pick" -> "pack"
    lines[2] = lines[2][:at] + b"a" + lines[2][at + 1 :]
    ref.write_bytes(b"".join(lines))
    record = json.loads(lines[2])
    k = next(i for i, m in enumerate(record["messages"]) if m["content"].startswith("pack "))
    failed = failures(pytester.runpytest_inprocess())
    sid = record["id"]
    assert set(failed) == {"test_reference_file[baseline]", f"test_reference_bytes[baseline-{sid}]"}
    message = failed[f"test_reference_bytes[baseline-{sid}]"]
    assert "data/baseline.jsonl:3" in message
    assert f"messages[{k}] (assistant) differs" in message
    assert f"first differing byte at offset {at} of the line" in message
    assert '"pack ' in message and '"pick ' in message


@pytest.mark.slow
def test_bad_guard_table_is_a_collection_error_that_keeps_snapshots(
    pytester: pytest.Pytester, project: Path
) -> None:
    write_config(project, extra='[tool.memeval.guards.extra]\nprofile = "nope"\n')
    before = digest(project / SNAPSHOTS)
    result = pytester.runpytest_inprocess("--snapshot-update")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*pyproject.toml: [[]tool.memeval.guards.extra[]]: key 'profile': unknown --ckpt 'nope'*"]
    )
    assert digest(project / SNAPSHOTS) == before


@pytest.mark.slow
def test_collect_only_neither_fails_nor_deletes_snapshots(
    pytester: pytest.Pytester, project: Path
) -> None:
    before = digest(project / SNAPSHOTS)
    result = pytester.runpytest_inprocess("--collect-only", "--snapshot-update")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*{N_ITEMS} tests collected*"])
    assert digest(project / SNAPSHOTS) == before


@pytest.mark.slow
def test_without_guard_tables_the_items_skip_and_say_why(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n")
    pytester.makepyfile(**{GUARD_MODULE: GUARDS})
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines(
        ["*no [[]tool.memeval.guards.*[]] table enables this guard (it needs reference = PATH)*"]
    )


@pytest.mark.slow
def test_xdist_update_keeps_snapshots_and_rewrites_only_what_changed(
    pytester: pytest.Pytester, project: Path
) -> None:
    # --snapshot-update is where a wrong unused-snapshot verdict (e.g. from an unmerged
    # worker report) would delete files: one xdist update run shows it does not.
    before = digest(project / SNAPSHOTS)
    template = project / "tok" / "chat_template.jinja"
    template.write_text(template.read_text("utf-8").replace("' <|eot|> '", "' <|eot|>  <|eot|> '"))
    result = run_forked(pytester, "-n", "2", "--snapshot-update", timeout=300)
    result.assert_outcomes(passed=N_ITEMS)
    passed, updated = N_SNAPSHOTS - 2 * N, 2 * N
    result.stdout.fnmatch_lines([f"*{passed} snapshots passed. {updated} snapshots updated."])
    result.stdout.no_fnmatch_line("*unused*")
    after = digest(project / SNAPSHOTS)
    assert set(after) == set(before)  # nothing lost, nothing stray (atomic writes leave no tmp)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {name for name in before if name.endswith(".tokens")}
    # What the workers wrote is what a plain run now accepts.
    pytester.runpytest_inprocess().assert_outcomes(passed=N_ITEMS)
