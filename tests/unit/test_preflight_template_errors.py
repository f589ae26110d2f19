"""Which exceptions the template preflight reports as the user's chat-template error.

Real tokenizer (the demo base model's), real templates a user could ship: their errors are
collected per scenario; an exception that can only be a bug in the plugin propagates.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from transformers import AutoTokenizer

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.model import preflight
from pytest_memeval.model.preflight import scan_scenarios

from ..conftest import BASE_MODEL, demo_records


@pytest.fixture(scope="module")
def base_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(BASE_MODEL))


@pytest.fixture(scope="module")
def scenarios() -> list[Scenario]:
    return list(from_records(demo_records("oracle", 2), "demo").scenarios)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "{{ raise_exception('System role not supported') }}",
            "TemplateError: System role not supported",
        ),
        ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "TypeError: "),
        ("{% for m in messages %}{{ m.content }}", "TemplateSyntaxError: "),
        ("{{ messages[0].nope.deeper }}", "UndefinedError: "),
        (None, "ValueError: Cannot use chat template functions"),
    ],
)
def test_errors_of_a_users_template_are_collected_per_scenario(
    base_tokenizer: Any, scenarios: list[Scenario], template: str | None, expected: str
) -> None:
    tokenizer = copy.deepcopy(base_tokenizer)
    tokenizer.chat_template = template
    errors, lengths = scan_scenarios(tokenizer, scenarios, 8)
    assert sorted(errors) == sorted(s.id for s in scenarios)
    assert lengths == {}
    for error in errors.values():
        assert error.startswith(expected), error


def test_the_demo_template_renders_every_scenario(
    base_tokenizer: Any, scenarios: list[Scenario]
) -> None:
    errors, lengths = scan_scenarios(base_tokenizer, scenarios, 8)
    assert errors == {}
    assert sorted(lengths) == sorted(s.id for s in scenarios)
    assert all(n > 8 for n in lengths.values())


@pytest.mark.parametrize("bug", [KeyError("role"), AttributeError("x"), AssertionError()])
def test_a_bug_in_rendering_propagates(
    base_tokenizer: Any,
    scenarios: list[Scenario],
    monkeypatch: pytest.MonkeyPatch,
    bug: Exception,
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise bug  # stands for a programming error in prompts.render or compat

    monkeypatch.setattr(preflight, "render", broken)
    with pytest.raises(type(bug)):
        scan_scenarios(base_tokenizer, scenarios, 8)
