"""Messages never suggest the very word the user wrote, and show what tells a word apart from a known one when it
cannot be seen: characters outside ASCII by code point, spaces around it."""

import pytest

from finetune_bench.inputs.arms import ArmError, parse_arm
from finetune_bench.inputs.errors import SpecError, closest, invisible_difference
from finetune_bench.inputs.settings import TrainingArgs


def test_the_word_written_is_never_its_own_suggestion():
    assert closest("baseline", ["baseline", "liger"]) == ""
    with pytest.raises(ArmError) as error:
        parse_arm("baseline+liger")
    message = str(error.value)
    assert "did you mean 'baseline'" not in message
    assert "'baseline' is an arm of its own, not a component to join with '+'" in message
    assert "write 'liger' instead, and 'baseline' as an arm beside it" in message


def test_a_lookalike_character_is_named_by_its_code_point():
    assert invisible_difference("b\u0430seline", "baseline") == (
        "; 'b\u0430seline' has U+0430 (CYRILLIC SMALL LETTER A) where 'baseline' has 'a'"
    )
    assert invisible_difference("liger ", "liger") == "; 'liger ' has a space after it"
    assert invisible_difference(" liger ", "liger") == "; ' liger ' has a space before and a space after it"
    assert invisible_difference("ligr", "liger") == ""
    assert invisible_difference("lager", "liger") == "", "a visible difference needs no note"


def test_a_choice_and_a_key_that_differ_invisibly_say_how():
    with pytest.raises(SpecError) as error:
        TrainingArgs.from_mapping({"backend": "pl\u0430in_loop", "max_steps ": 4})
    problems = "\n".join(error.value.problems)
    assert (
        "got 'pl\u0430in_loop'; 'pl\u0430in_loop' has U+0430 (CYRILLIC SMALL LETTER A) where 'plain_loop' has 'a'"
        in problems
    )
    assert (
        "training_args.'max_steps ' is not a setting (did you mean 'max_steps'?); 'max_steps ' has a space after it"
        in problems
    )
