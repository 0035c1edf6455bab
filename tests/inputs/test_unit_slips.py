"""Unit slips and YAML 1.1's traps, refused with what to write instead: a learning rate above 1 (unless the inputs
say it is meant), a zero-padded integer (octal to YAML 1.1), yes/no/on/off where a string belongs, a decimal comma."""

import pytest
import yaml

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.reading import yaml11_traps
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


def test_a_learning_rate_above_1_is_refused_unless_it_is_meant():
    with pytest.raises(SpecError, match=r"training_args\.learning_rate 2\.0 is above 1 .*condition learning_rate=2\.0"):
        plan_runs(ExperimentArgs(learning_rate=[2e-5, 2.0]), TrainingArgs(), 1)
    plan_runs(ExperimentArgs(learning_rate=[2e-5, 2.0]), TrainingArgs(allow_learning_rate_above_1=True), 1)
    plan_runs(ExperimentArgs(), TrainingArgs(learning_rate=1.0), 1)


def test_a_zero_padded_integer_is_named_with_its_line_and_what_yaml_made_of_it():
    data = yaml.safe_load("training_args:\n  max_steps: 4\n  seed: 032\nn_runs: 010\n")
    assert data["training_args"]["seed"] == 26 and data["training_args"]["max_steps"] == 4
    assert yaml11_traps(data) == [
        "training_args.seed: 032 (line 3) is read by YAML 1.1 as the octal number 26; write 32 without the leading "
        "zero, or quote it ('032') if text is meant",
        "n_runs: 010 (line 4) is read by YAML 1.1 as the octal number 8; write 10 without the leading zero, or quote "
        "it ('010') if text is meant",
    ]
    assert yaml11_traps(yaml.safe_load("a: 0\nb: '032'\nc: [1, 2]\n")) == []


def test_a_decimal_comma_is_named_in_a_list_and_in_a_scalar():
    (trap,) = yaml11_traps(yaml.safe_load("experiment_args:\n  learning_rate: [2,0e-5]\n"))
    assert "2, '0e-5' (items 0 and 1) look like one number with a decimal comma" in trap and "write 2.0e-5" in trap
    with pytest.raises(SpecError, match=r"got '2,0e-5' \(a decimal comma: write 2\.0e-5\)"):
        TrainingArgs.from_mapping(yaml.safe_load("learning_rate: 2,0e-5"))
    # digits YAML read as text were quoted: no decimal comma there (the wrong type is named elsewhere)
    assert yaml11_traps(yaml.safe_load('experiment_args:\n  per_device_train_batch_size: [1, "2"]\n')) == []


@pytest.mark.parametrize(("word", "read_as"), [("no", "false"), ("off", "false"), ("yes", "true"), ("on", "true")])
def test_yes_no_on_off_where_a_string_belongs_say_how_yaml_read_them(word, read_as):
    with pytest.raises(
        SpecError, match=rf"must be str, got (True|False) \(YAML 1\.1 reads an unquoted .* as {read_as}"
    ):
        TrainingArgs.from_mapping(yaml.safe_load(f"dataset_config: {word}"))


def test_digits_joined_by_colons_are_named_as_the_base_60_number_yaml_makes_of_them():
    data = yaml.safe_load("condition_timeout_s: 2:15\ntraining_args:\n  learning_rate: 1:00.5\nn_runs: '1:2'\n")
    assert data["condition_timeout_s"] == 135, "YAML 1.1 reads it silently"
    assert yaml11_traps(data) == [
        "condition_timeout_s: 2:15 (line 1) is read by YAML 1.1 as the base-60 number 135 (digits joined by colons); "
        "write the number itself (135, e.g. seconds), or quote it ('2:15') if text is meant",
        "training_args.learning_rate: 1:00.5 (line 3) is read by YAML 1.1 as the base-60 number 60.5 (digits joined "
        "by colons); write the number itself (60.5, e.g. seconds), or quote it ('1:00.5') if text is meant",
    ]


def test_a_thousands_separator_in_a_flow_list_is_one_problem_saying_to_drop_the_commas():
    data = yaml.safe_load("sweep:\n  tokens: [512, 2,048, 1,000,000]\n  other: [100,200, 3,5]\n")
    assert data["sweep"]["tokens"] == [512, 2, "048", 1, 0, 0], "items YAML made of them"
    assert yaml11_traps(data) == [
        "sweep.tokens: 2,048 (line 2) is read by YAML 1.1 as 2 items of the list, not one number (a comma separates "
        "items); write 2048 without the commas",
        "sweep.tokens: 1,000,000 (line 2) is read by YAML 1.1 as 3 items of the list, not one number (a comma "
        "separates items, and 000 is the octal number 0, and 000 is the octal number 0); write 1000000 without the "
        "commas",
    ], "[100,200, 3,5] are lists of plain numbers, written tightly"


def test_a_zero_padded_item_after_a_comma_that_is_no_thousands_group_may_be_a_decimal_comma():
    (trap,) = yaml11_traps(yaml.safe_load("experiment_args:\n  learning_rate: [3,07]\n"))
    assert trap == (
        "experiment_args.learning_rate: 3,07 (line 2) is read by YAML 1.1 as 2 items of the list (a comma separates "
        "items, and 07 is the octal number 7); write 3.07 for one number with a decimal comma, or [3, 7] for "
        "separate items"
    )
    with_spaces = yaml11_traps(yaml.safe_load("experiment_args:\n  max_seq_length: [1, 064]\n"))
    assert with_spaces == [
        "experiment_args.max_seq_length[1]: 064 (line 2) is read by YAML 1.1 as the octal number 52; write 64 without "
        "the leading zero, or quote it ('064') if text is meant"
    ], "after a space it is a zero-padded item of its own"


@pytest.mark.parametrize(
    ("key", "text", "hint"),
    [
        ("max_steps", "2,000", "(a thousands separator: write 2000)"),
        ("max_steps", "1,000,000", "(a thousands separator: write 1000000)"),
        ("weight_decay", "1,000", "(a thousands separator or a decimal comma: write 1000, or 1.000)"),
        ("max_steps", "0384", "(write 384 without the leading zero)"),
        ("max_steps", "09", "(write 9 without the leading zero)"),
    ],
)
def test_a_number_yaml_reads_as_text_says_what_to_write(key, text, hint):
    with pytest.raises(SpecError) as error:
        TrainingArgs.from_mapping(yaml.safe_load(f"{key}: {text}"))
    (problem,) = error.value.problems
    assert problem.endswith(f"got {text!r} {hint}"), problem
