"""Messages never suggest the very word the user wrote, and show what tells a word apart from a known one when it
cannot be seen: characters outside ASCII by code point, spaces around it."""

import pytest

from finetune_bench.inputs.arms import ArmError, parse_arm
from finetune_bench.inputs.errors import SpecError, closest, invisible_difference
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


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


def test_a_character_that_does_not_show_is_named_whatever_the_lengths():
    assert invisible_difference("max_\u200bsteps", "max_steps") == (
        "; 'max_\\u200bsteps' has U+200B (ZERO WIDTH SPACE), which does not show"
    )
    assert invisible_difference("plain_loop\xa0", "plain_loop") == (
        "; 'plain_loop\\xa0' has U+00A0 (NO-BREAK SPACE) after it"
    )
    assert (
        invisible_difference("r\u00f6pe", "rope")
        == "; 'r\u00f6pe' has U+00F6 (LATIN SMALL LETTER O WITH DIAERESIS) where 'rope' has 'o'"
    )
    assert invisible_difference("rms\u2010norm", "rms_norm") == (
        "; 'rms\u2010norm' has U+2010 (HYPHEN) where 'rms_norm' has '_'"
    )
    assert invisible_difference("swi\u200dglu ", "swiglu") == (
        "; 'swi\\u200dglu ' has U+200D (ZERO WIDTH JOINER), which does not show, and a space after it"
    )
    assert closest("qu\u200bux", ["model_name"]) == "; 'qu\\u200bux' has U+200B (ZERO WIDTH SPACE), which does not show"
    assert closest("quux", ["model_name"]) == ""


def test_a_key_with_a_character_that_does_not_show_is_shown_escaped():
    with pytest.raises(SpecError) as error:
        TrainingArgs.from_mapping({"seed\u2060": 3, "optim": "sgd\u00ad", "dtype": "bfl\u200boat16"})
    assert error.value.problems == [
        "training_args.'seed\\u2060' is not a setting (did you mean 'seed'?); 'seed\\u2060' has U+2060 (WORD JOINER), "
        "which does not show",
        "training_args.optim must be one of ['adamw_torch', 'adamw_torch_fused', 'sgd', 'adafactor', 'adagrad', "
        "'rmsprop', 'adamw_8bit'], got 'sgd\\xad'; 'sgd\\xad' has U+00AD (SOFT HYPHEN), which does not show",
        "training_args.dtype must be one of ['auto', 'bfloat16', 'float16', 'float32'], got 'bfl\\u200boat16'; "
        "'bfl\\u200boat16' has U+200B (ZERO WIDTH SPACE), which does not show",
    ]
    assert "\u2060" not in str(error.value) and "\u200b" not in str(error.value), "every one is escaped"


def test_a_training_setting_given_as_an_axis_is_told_it_cannot_be_swept():
    with pytest.raises(SpecError) as error:
        ExperimentArgs.from_mapping({"warmup_ratio": [0.0, 0.1], "arm": ["liger"]})
    assert error.value.problems == [
        "experiment_args.warmup_ratio is not a setting: warmup_ratio is a training setting that cannot be swept; set "
        "one value for every condition under training_args: (training_args: {warmup_ratio: ...})"
    ], "not 'did you mean' an axis of another name"
