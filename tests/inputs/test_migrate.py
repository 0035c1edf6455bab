"""The Union tutorial's inputs file: `make migrate` (finetune_bench.inputs.migrate) converts it by the one table of
the tutorial's keys, says what it changed and what it could not convert, and the converted file plans."""

import dataclasses
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.migrate import main, migrate, migration_hint
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.reading import check_inputs_file
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.inputs.tutorial import TUTORIAL_KEYS

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = Path(__file__).parent / "bad_inputs" / "union_tutorial_full.yaml"


def test_every_setting_of_the_table_is_a_setting_and_no_tutorial_key_is_one():
    training = {f.name for f in dataclasses.fields(TrainingArgs)}
    for entry in TUTORIAL_KEYS.values():
        assert entry.key not in training, entry
        assert entry.setting is None or entry.setting in training, entry
        assert entry.setting is not None or entry.why, f"{entry.key}: a key left out says why nothing is lost"


def test_the_tutorial_file_converts_to_settings_that_plan():
    migration = migrate(yaml.safe_load(TUTORIAL.read_text()))
    experiment, training = migration.inputs["experiment_args"], migration.inputs["training_args"]
    assert experiment == {"arm": ["liger", "baseline"], "per_device_train_batch_size": [16, 24, 32, 40, 48, 56]}
    assert training["dataset_name"] == "tatsu-lab/alpaca" and training["dtype"] == "bfloat16"
    # the tutorial's training_args.arm and batch size are swept: left out, said (planning refuses both given)
    assert "arm" not in training and "per_device_train_batch_size" not in training
    assert any(line.startswith("training_args.arm: liger: experiment_args.arm sweeps it") for line in migration.dropped)
    assert training["max_steps"] == 40 and training["optim"] == "sgd"
    assert not {"dataset", "bf16", "use_liger", "num_train_epochs", "report_to"} & set(training)
    assert [str(c) for c in migration.changed] == [
        "experiment_args.use_liger: [true, false] → experiment_args.arm: [liger, baseline]",
        "training_args.dataset → training_args.dataset_name",
        "training_args.use_liger: true → training_args.arm: liger",
        "training_args.bf16: true → training_args.dtype: bfloat16",
        # the epochs the tutorial trains are the fine-tune the report projects
        "training_args.num_train_epochs: 1 → fine_tune_epochs: 1",
    ]
    assert migration.inputs["fine_tune_epochs"] == 1
    assert len(migration.dropped) == 8 and not migration.not_converted  # 2 of them: swept axes
    # a setting that would act in no condition of the converted grid is left out, said (planning would refuse it)
    assert "training_args.per_device_eval_batch_size: 16: it acts only with held-out examples" in " ".join(
        migration.dropped
    )
    # The converted file reads as a whole and plans: 2 arms × 6 batch sizes × 3 runs.
    from workflows.benchmark import benchmarking_experiment

    check_inputs_file(migration.inputs, benchmarking_experiment.python_interface.inputs_with_defaults, "b")
    runs = plan_runs(ExperimentArgs.from_mapping(experiment), TrainingArgs.from_mapping(training), 3)
    assert len(runs) == 36 and not any(run.refused for run in runs)


def test_make_migrate_writes_the_file_and_make_plan_runs_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "converted.yaml"
    assert main([str(TUTORIAL), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    assert "experiment_args.use_liger: [true, false] → experiment_args.arm: [liger, baseline]" in printed
    assert "training_args.num_train_epochs: 1 → fine_tune_epochs: 1" in printed
    assert "NOT converted" not in printed
    assert "arm: [liger, baseline]" in out.read_text()  # lists written inline, as the inputs files are

    # `make plan INPUTS=<converted>`: the dry run of the benchmark workflow, in this process.
    from flytekit.clis.sdk_in_container.pyflyte import main as pyflyte

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(tmp_path / "export"))
    args = ["run", "workflows/benchmark.py", "benchmarking_experiment", "--inputs-file", str(out), "--dry_run"]
    result = CliRunner().invoke(pyflyte, [*args, "--gpu_kind", "H100"])
    assert result.exit_code == 0, result.output
    plan = (tmp_path / "export" / "plan.csv").read_text()
    assert "arm=liger,per_device_train_batch_size=56" in plan and "arm=baseline,per_device_train_batch_size=16" in plan


def test_what_cannot_be_converted_is_left_out_and_said(tmp_path, capsys):
    inputs = {
        "experiment_args": {"use_liger": [True, False], "bf16": [True, False]},
        "training_args": {"use_liger": True, "arm": "compile", "eval_strategy": "steps", "gradient_clip": 1.0},
        "n_runs": 2,
    }
    migration = migrate(inputs)
    # training_args.arm is replaced by the arms use_liger sweeps: left out, and said
    assert migration.inputs["training_args"] == {} and migration.inputs["n_runs"] == 2
    assert any(
        line.startswith("training_args.arm: compile: experiment_args.arm sweeps it") for line in migration.dropped
    )
    assert migration.inputs["experiment_args"] == {"arm": ["liger", "baseline"]}
    assert migration.not_converted == [
        "experiment_args.bf16: [true, false]: no equivalent for this value (bf16: false leaves dtype at auto)",
        "training_args.use_liger: true: training_args.arm already sets arm",
        "training_args.eval_strategy: steps: no equivalent for this value (held-out evaluation is off unless "
        "eval_examples is set, see docs/settings.md)",
        "training_args.gradient_clip: 1.0: not a setting here, and no equivalent is known",
    ]
    source = tmp_path / "mine.yaml"
    source.write_text(yaml.safe_dump(inputs))
    assert main([str(source)]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "mine.migrated.yaml").exists()
    assert "NOT converted (left out of the file" in printed and "training_args.gradient_clip: 1.0" in printed


def test_the_hint_is_for_the_tutorials_keys_only():
    hint = migration_hint(yaml.safe_load(TUTORIAL.read_text()), "phi3_inputs.yaml")
    assert hint.startswith("hint: these are the Union tutorial's keys; `make migrate INPUTS=phi3_inputs.yaml`")
    assert "use_liger: [true, false] → arm: [liger, baseline]; dataset → dataset_name" in hint
    assert "bf16: true → dtype: bfloat16" in hint and "\n" not in hint
    assert migration_hint(yaml.safe_load((ROOT / "inputs" / "phi3_alpaca.yaml").read_text())) == ""
    assert migration_hint({"training_args": {"max_stepz": 3}}) == ""


def test_each_tutorial_key_says_what_it_is_here():
    with pytest.raises(SpecError) as refused:
        TrainingArgs.from_mapping({"bf16": True, "num_train_epochs": 1, "dataset": "x"})
    assert refused.value.problems == [
        "training_args.bf16 is not a setting (did you mean 'dtype'? bf16: true is dtype: bfloat16)",
        "training_args.num_train_epochs is not a setting (nothing to set here: every run trains max_steps optimizer "
        "steps; the fine-tune the report projects is the top-level fine_tune_epochs, which make migrate sets from it)",
        "training_args.dataset is not a setting (did you mean 'dataset_name'?)",
    ]


def test_epochs_without_max_steps_write_max_steps_to_set_by_hand(tmp_path, capsys):
    source = tmp_path / "epochs.yaml"
    source.write_text(yaml.safe_dump({"training_args": {"dataset": "tatsu-lab/alpaca", "num_train_epochs": 3}}))
    assert main([str(source)]) == 0
    printed = capsys.readouterr().out
    written = (tmp_path / "epochs.migrated.yaml").read_text()
    (line,) = [line for line in written.splitlines() if line.strip().startswith("max_steps")]
    assert line.startswith(f"  max_steps: {TrainingArgs().max_steps}  # SET BY HAND: the tutorial trained ")
    assert "num_train_epochs: 3" in line
    assert yaml.safe_load(written)["training_args"]["max_steps"] == TrainingArgs().max_steps
    assert "written with a placeholder: SET BY HAND before a real run:\n  training_args.max_steps: " in printed
    # a file that says max_steps (given or swept) keeps it, without a comment
    for inputs in (
        {"training_args": {"num_train_epochs": 1, "max_steps": 40}},
        {"experiment_args": {"max_steps": [10, 20]}, "training_args": {"num_train_epochs": 1}},
    ):
        assert not migrate(inputs).to_set
