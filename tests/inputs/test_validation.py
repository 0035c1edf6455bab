"""Validation reports every problem at once, refuses what cannot run (non-finite numbers, out-of-range seeds,
integers beyond int64, grids too large) before expanding anything, and checks where outputs go."""

import time
from dataclasses import dataclass

import pytest

from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.rules import check_fields, choice, fraction, positive
from finetune_bench.inputs.sections import check_section
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.inputs.validation import MAX_RUNS, check_writable_location, validate_run_settings


def problems_of(call) -> list[str]:
    with pytest.raises(SpecError) as error:
        call()
    return error.value.problems


def test_every_problem_of_a_section_is_reported_at_once():
    found = problems_of(
        lambda: check_section(
            TrainingArgs, "training_args", {"use_liger": True, "dataset": "x", "max_steps": "4", "seed": -1}
        )
    )
    assert [p.split(" ")[0] for p in found] == [
        "training_args.use_liger",
        "training_args.dataset",
        "training_args.max_steps",
        "training_args.seed",
    ]


@dataclass
class RuledExample:
    count: int = positive(1)
    kind: str = choice("a", ("a", "b"))
    share: float = fraction(0.5)
    label: str = "x"


def test_the_rules_declared_with_the_fields_report_every_problem_in_field_order():
    example = RuledExample(count=0, kind="c", share=1.0)
    assert problems_of(lambda: check_fields(example, "example")) == [
        "example.count must be positive, got 0",
        "example.kind must be one of ['a', 'b'], got 'c'",
        "example.share must be in [0, 1), got 1.0",
    ]
    assert problems_of(lambda: check_fields(example, "example", names=["kind"])) == [
        "example.kind must be one of ['a', 'b'], got 'c'"
    ]
    # typed: the annotation first, so that a rule only sees values of its type
    assert problems_of(lambda: check_fields(RuledExample(count="3", label=1), "example", typed=True)) == [
        "example.count must be int, got '3'",
        "example.label must be str, got 1",
    ]
    check_fields(RuledExample(), "example", typed=True)
    assert RuledExample().count == 1  # the default stays a plain value (Flyte serializes it)


def test_one_problem_is_one_line_and_many_are_a_list():
    assert str(SpecError("a is wrong")) == "a is wrong"
    assert str(SpecError("a is wrong", "b is wrong")) == "2 problems in the inputs:\n- a is wrong\n- b is wrong"
    collected = Problems()
    for message in ("x", "y", "x"):
        with collected.check():
            raise SpecError(message)
    assert collected.found == ["x", "y"]


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("learning_rate", float("nan"), "training_args.learning_rate must be a finite number, got nan"),
        ("max_grad_norm", float("inf"), "training_args.max_grad_norm must be a finite number, got inf"),
        ("warmup_ratio", float("-inf"), "training_args.warmup_ratio must be a finite number"),
        ("weight_decay", -0.01, "training_args.weight_decay must not be negative, got -0.01"),
        ("seed", 2**32, "training_args.seed must be in [0, 2**32)"),
        ("seed", -1, "training_args.seed must be in [0, 2**32)"),
        ("max_steps", 2**63, "training_args.max_steps is too large (at most 9,223,372,036,854,775,807)"),
        ("pad_to_multiple_of", -8, "training_args.pad_to_multiple_of must not be negative (0 turns it off), got -8"),
    ],
)
def test_values_that_pass_the_type_but_cannot_run_are_refused(setting, value, message):
    (found,) = problems_of(lambda: plan_runs(ExperimentArgs(), TrainingArgs(**{setting: value}), 1))
    assert found.startswith(message)


def test_settings_problems_and_grid_problems_come_together():
    training = TrainingArgs(weight_decay=-1.0)
    found = problems_of(lambda: plan_runs(ExperimentArgs(arm=["liger"]), training, 0))
    assert found == [
        "training_args.weight_decay must not be negative, got -1.0",
        "n_runs must be a positive integer, got 0",
    ]


def test_a_huge_grid_is_refused_by_arithmetic_before_it_is_expanded():
    experiment = ExperimentArgs(
        per_device_train_batch_size=list(range(1, 101)),
        max_seq_length=list(range(1, 101)),
        learning_rate=[1e-5 * k for k in range(1, 101)],
    )  # 10^6 conditions
    started = time.monotonic()
    (found,) = problems_of(lambda: plan_runs(experiment, TrainingArgs(), 1))
    assert time.monotonic() - started < 5
    assert found.startswith(f"the grid is 1,000,000 condition(s) × n_runs 1 = 1,000,000 runs; at most {MAX_RUNS:,}")
    (found,) = problems_of(lambda: plan_runs(ExperimentArgs(), TrainingArgs(), 10**20))
    assert "n_runs 100,000,000,000,000,000,000" in found


def test_a_problem_shared_by_many_conditions_is_said_once():
    experiment = ExperimentArgs(per_device_train_batch_size=[1, 2, 4], backend=["hf_trainer"], criterion=["trl"])
    (found,) = problems_of(lambda: plan_runs(experiment, TrainingArgs(), 1))
    assert found.startswith("criterion 'trl' does not run with backend 'hf_trainer' (in 3 conditions, e.g. condition")


def test_a_padding_multiple_must_divide_every_swept_max_seq_length_and_not_come_with_packing():
    training = TrainingArgs(pad_to_multiple_of=128)
    plan_runs(ExperimentArgs(max_seq_length=[128, 512]), training, 1)
    (found,) = problems_of(lambda: plan_runs(ExperimentArgs(max_seq_length=[128, 200]), training, 1))
    assert found.startswith(
        "training_args.pad_to_multiple_of (128) does not divide max_seq_length (200) (condition max_seq_length=200"
    )
    packed = TrainingArgs(backend="trl_sft", packing=True, max_seq_length=128, pad_to_multiple_of=128)
    (found,) = problems_of(lambda: plan_runs(ExperimentArgs(), packed, 1))
    assert found.startswith("training_args.pad_to_multiple_of (128) with packing")


def test_the_workflow_settings_are_all_checked():
    assert len(problems_of(lambda: validate_run_settings(0, 0.0, 0, 2.0))) == 4


def test_where_outputs_go_must_take_files(tmp_path):
    check_writable_location(str(tmp_path / "new" / "deeper"), "results_store")  # creatable: fine
    check_writable_location("s3://bucket/prefix", "results_store")  # a URL: its filesystem decides
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    (found,) = problems_of(lambda: check_writable_location(str(a_file / "below"), "results_store"))
    assert found == f"results_store: {str(a_file)!r} is not a directory (got {str(a_file / 'below')!r})"


def test_a_problem_never_echoes_a_secret_of_the_environment(monkeypatch, tmp_path):
    secret = "wandbPASTEDkey0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    (found,) = problems_of(lambda: plan_runs(ExperimentArgs(), TrainingArgs(model_name=f"./{secret}"), 1))
    assert secret not in found
    assert found.startswith("training_args.model_name: the local path './[redacted]' does not exist (a local path")


def test_every_bundled_inputs_file_has_unique_keys():
    from pathlib import Path

    import yaml

    from tasks.inputs_yaml import require_unique_keys

    require_unique_keys()
    for path in sorted((Path(__file__).resolve().parents[2] / "inputs").glob("*.yaml")):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path.name
    with pytest.raises(yaml.YAMLError, match="the key 'a' is given twice"):
        yaml.safe_load("a: 1\na: 2\n")


def test_merge_keys_merge_and_a_key_beside_them_overrides():
    """YAML 1.1: `<<` merges mappings (of a list, the first wins), a key beside it overrides the merged value, and
    a key written twice in one mapping, beside a merge or in a merged one, is still refused."""
    import yaml

    from tasks.inputs_yaml import require_unique_keys

    require_unique_keys()
    merged = yaml.safe_load("a: &a {x: 1, y: 2}\nb: &b {x: 3, z: 4}\nc: {<<: [*a, *b], y: 5}\n")
    assert merged["c"] == {"x": 1, "y": 5, "z": 4}
    # An anchored mapping inside a list is constructed after the mapping that merges it: its own override stands.
    nested = yaml.safe_load("l: [&a {x: 1}, &b {<<: *a, x: 2, y: 1}]\nc: {<<: *b, y: 3}\n")
    assert nested == {"l": [{"x": 1}, {"x": 2, "y": 1}], "c": {"x": 2, "y": 3}}
    with pytest.raises(yaml.YAMLError, match=r"the key 'x' is given twice \(lines 4 and 5\)"):
        yaml.safe_load("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\n  x: 3\n")
    with pytest.raises(yaml.YAMLError, match="the key 'x' is given twice"):
        yaml.safe_load("b: {<<: {x: 1, x: 2}}\n")


def test_liger_s_table_is_read_from_its_source_as_importing_it_would_give():
    """Planning reads Liger's table of patch functions from its source (importing it takes seconds); the reading
    must be exactly what the imported module says."""
    from finetune_bench.inputs.arms import liger_table_from_import, liger_table_from_source

    from_source = liger_table_from_source()
    assert from_source == liger_table_from_import()
    assert from_source["llama"]["fused_linear_cross_entropy"] is True and from_source["llama"]["cross_entropy"] is False


def test_every_conflict_of_a_condition_is_named_not_only_the_first():
    """LoRA on the default trl_sft backend and a float8 arm with LoRA: two problems of one condition, both said."""
    from finetune_bench.inputs.condition_checks import validate_condition

    args = TrainingArgs(lora_rank=8, arm="float8+compile", device="cuda")
    with pytest.raises(SpecError) as error:
        validate_condition(args, {"arm": "float8+compile"})
    problems = error.value.problems
    assert any(p.startswith("lora_rank 8 does not run with backend 'trl_sft'") for p in problems), problems
    assert any(p.startswith("arm 'float8+compile' with lora_rank 8") for p in problems), problems


def test_a_condition_with_problems_and_a_refusal_reports_the_problems():
    """A refusal ends one condition as an error result; a problem of the inputs stops the grid, and comes first."""
    from finetune_bench.inputs.condition_checks import validate_condition

    args = TrainingArgs(model_name="random:tiny-gpt2", arm="liger", criterion="torch_cross_entropy")
    with pytest.raises(SpecError) as error:
        validate_condition(args, {})
    assert type(error.value) is SpecError
    assert "criterion 'torch_cross_entropy' does not run with backend 'trl_sft'" in str(error.value)
