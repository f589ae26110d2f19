"""The forward pass projects each row onto the vocabulary only at its own answer positions
(``compat.transformers.output_rows``): every logit it keeps is the model's own at that
position, whatever the other rows of the batch need, and the hook is gone after the pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.decode.fast import FastDecoder, ScenarioPlan
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records


@pytest.fixture(scope="module")
def demo() -> Iterator[LoadedModel]:
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


def test_each_row_keeps_the_logits_of_its_own_answer_positions(demo: LoadedModel) -> None:
    import torch

    fast = FastDecoder(demo, 16, calibrate=False)
    scenarios = list(from_records(demo_records("oracle", 3), "demo").scenarios)
    plans = [fast.planner.plan(s) for s in scenarios]
    assert all(isinstance(p, ScenarioPlan) for p in plans)
    passed = fast.forward.run(plans)  # type: ignore[arg-type]
    own = [
        {len(t.prompt.ids) - 1 + j for t in plan.turns for j in range(len(t.expected))}
        for plan in passed.plans
    ]
    # the rows' positions differ, so the union is more than any row's
    assert len(set().union(*own)) > max(len(positions) for positions in own)
    assert passed.logits.shape[1] == max(len(positions) for positions in own)
    head = demo.model.get_output_embeddings()
    assert not head._forward_pre_hooks  # the hook was removed
    for row, plan in enumerate(passed.plans):
        assert set(passed.columns[row]) == own[row]
        with torch.inference_mode():
            alone = demo.model(input_ids=torch.tensor([list(plan.full)])).logits[0].float()
        for position in sorted(own[row]):
            got = passed.logits_at(row, position)
            torch.testing.assert_close(got, alone[position], rtol=0, atol=1e-4)
            assert int(got.argmax()) == int(alone[position].argmax())
