"""Third-party warnings the user cannot act on are ignored narrowly: by category, message and
module, only inside the plugin's own call; every other warning is still shown."""

from __future__ import annotations

import warnings

import pytest

from pytest_memeval.core.noise import THIRD_PARTY_NOISE, Noise, third_party_noise_filtered

DEPRECATION = (
    "`is_gradient_checkpointing` is deprecated and will be removed in v6. "
    "Use `is_activation_checkpointing` instead."
)


def _warn(message: str, category: type[Warning], module: str) -> None:
    # As transformers' property warns: the module is the one the warning is raised in.
    warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 3312, module=module)


def _caught(block: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if block:
            with third_party_noise_filtered():
                _emit_all()
        else:
            _emit_all()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def _emit_all() -> None:
    _warn(DEPRECATION, FutureWarning, "transformers.modeling_utils")  # the noise
    _warn(DEPRECATION, FutureWarning, "my_project.training")  # the same text, the user's
    _warn("`foo` is deprecated", FutureWarning, "transformers.modeling_utils")  # another one
    _warn(DEPRECATION, DeprecationWarning, "transformers.modeling_utils")  # another category
    warnings.warn("the user's own warning", UserWarning, stacklevel=1)


def test_only_the_listed_warning_is_ignored_inside_the_block() -> None:
    assert len(_caught(block=False)) == 5
    kept = _caught(block=True)
    assert kept == [
        f"FutureWarning: {DEPRECATION}",  # from the user's module: kept
        "FutureWarning: `foo` is deprecated",
        f"DeprecationWarning: {DEPRECATION}",
        "UserWarning: the user's own warning",
    ]


def test_filters_are_restored_after_the_block() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with third_party_noise_filtered():
            pass
        _warn(DEPRECATION, FutureWarning, "transformers.modeling_utils")
    assert len(caught) == 1  # outside the plugin's call, transformers' warning is shown


@pytest.mark.parametrize("noise", THIRD_PARTY_NOISE)
def test_each_entry_is_narrow_and_says_why(noise: Noise) -> None:
    assert noise.module.startswith(("transformers", "peft", "mlflow"))
    assert noise.message and len(noise.why) > 40


def test_mlflows_sqlalchemy_deprecation_is_ignored_inside_the_block() -> None:
    class SADeprecationWarning(DeprecationWarning):  # SQLAlchemy's, a DeprecationWarning
        pass

    message = "The ``noload`` loader strategy is deprecated and will be removed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with third_party_noise_filtered():
            _warn(message, SADeprecationWarning, "mlflow.store.tracking.sqlalchemy_store")
            _warn(message, SADeprecationWarning, "my_project.db")
    assert [w.filename for w in caught] == ["my_project/db.py"]


def test_the_module_must_match_whole() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with third_party_noise_filtered():
            _warn(DEPRECATION, FutureWarning, "transformers.modeling_utils_extra")
    assert len(caught) == 1
