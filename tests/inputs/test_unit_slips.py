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


@pytest.mark.parametrize(("word", "read_as"), [("no", "false"), ("off", "false"), ("yes", "true"), ("on", "true")])
def test_yes_no_on_off_where_a_string_belongs_say_how_yaml_read_them(word, read_as):
    with pytest.raises(
        SpecError, match=rf"must be str, got (True|False) \(YAML 1\.1 reads an unquoted .* as {read_as}"
    ):
        TrainingArgs.from_mapping(yaml.safe_load(f"dataset_config: {word}"))
