import dataclasses
from pathlib import Path

import pytest
import yaml

from finetune_bench.inputs.arms import ArmError, kernel_switches, parse_arm
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, axis_names


def test_every_axis_is_a_training_setting():
    training_fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    assert set(axis_names()) <= training_fields
    assert {"arm", "per_device_train_batch_size"} <= set(axis_names())


def test_plan_crosses_swept_axes_and_interleaves_repeats():
    experiment = ExperimentArgs(
        arm=["liger", "baseline"], per_device_train_batch_size=[4, 8], max_seq_length=[128, 256]
    )
    runs = plan_runs(experiment, TrainingArgs(), n_runs=3)
    assert len(runs) == 2 * 2 * 2 * 3
    # all conditions of repeat 0 come before any of repeat 1
    assert [r.run_number for r in runs] == sorted(r.run_number for r in runs)
    first_repeat = runs[:8]
    assert len({r.condition_id for r in first_repeat}) == 8
    for run in runs:
        assert run.swept_axes == ["arm", "per_device_train_batch_size", "max_seq_length"]
        assert f"per_device_train_batch_size={run.training_args.per_device_train_batch_size}" in run.condition_id
    # settings that are not swept come from training_args
    assert {r.training_args.model_name for r in runs} == {TrainingArgs().model_name}


def test_unswept_axis_keeps_training_value():
    runs = plan_runs(ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[]), TrainingArgs(), 1)
    assert [r.condition_id for r in runs] == ["arm=liger", "arm=baseline"]
    assert all(r.training_args.per_device_train_batch_size == TrainingArgs().per_device_train_batch_size for r in runs)


@pytest.mark.parametrize(
    "experiment, training, n_runs, key",
    [
        (
            ExperimentArgs(per_device_train_batch_size=[0, 8]),
            TrainingArgs(),
            1,
            "experiment_args.per_device_train_batch_size",
        ),
        (
            ExperimentArgs(per_device_train_batch_size=[4, 4]),
            TrainingArgs(),
            1,
            "experiment_args.per_device_train_batch_size",
        ),
        (ExperimentArgs(arm=["yes"]), TrainingArgs(), 1, "experiment_args.arm: arm 'yes'"),
        (ExperimentArgs(), TrainingArgs(max_seq_length=-1), 1, "training_args.max_seq_length"),
        (ExperimentArgs(), TrainingArgs(dtype="fp8"), 1, "training_args.dtype"),
        (ExperimentArgs(), TrainingArgs(max_steps="10"), 1, "training_args.max_steps"),
        (ExperimentArgs(), TrainingArgs(timing_warmup_steps=4, max_steps=4), 1, "timing_warmup_steps"),
        (ExperimentArgs(), TrainingArgs(warmup_ratio=1.5), 1, "training_args.warmup_ratio"),
        (ExperimentArgs(), TrainingArgs(), 0, "n_runs"),
    ],
)
def test_bad_inputs_name_the_key(experiment, training, n_runs, key):
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        plan_runs(experiment, training, n_runs)


def test_a_criterion_its_backend_cannot_run_is_rejected_with_the_condition():
    experiment = ExperimentArgs(backend=["trl_sft", "plain_loop"], criterion=["trl"])
    with pytest.raises(SpecError, match=r"criterion 'trl' does not run with backend 'plain_loop'.*backend=plain_loop"):
        plan_runs(experiment, TrainingArgs(), 1)
    runs = plan_runs(
        ExperimentArgs(backend=["plain_loop"], criterion=["model", "liger_cross_entropy"]), TrainingArgs(), 1
    )
    assert [r.training_args.criterion for r in runs] == ["model", "liger_cross_entropy"]


@pytest.mark.parametrize(
    "name, liger, kernel, compiled, switchback",
    [
        ("baseline", False, (), False, False),
        ("baseline_repeat", False, (), False, False),
        ("liger", True, (), False, False),
        ("liger:rope", True, ("rope",), False, False),
        ("liger:rope,swiglu", True, ("rope", "swiglu"), False, False),
        ("compile", False, (), True, False),
        ("compile+liger", True, (), True, False),
        ("switchback", False, (), False, True),
    ],
)
def test_arm_names_parse_into_what_they_switch_on(name, liger, kernel, compiled, switchback):
    arm = parse_arm(name)
    assert (arm.liger, arm.liger_kernels, arm.compile, arm.switchback) == (liger, kernel, compiled, switchback)
    assert arm.is_baseline == (not (liger or compiled or switchback))


@pytest.mark.parametrize(
    "name, message",
    [
        ("ligr", r"unknown component 'ligr' \(did you mean 'liger'\?\)"),
        ("liger+liger", "names 'liger' twice"),
        ("compile:rope", "only liger takes kernels"),
        ("liger:rmsnorm", r"no kernel 'rmsnorm' \(did you mean 'rms_norm'\?\)"),
    ],
)
def test_meaningless_arm_names_are_refused(name, message):
    with pytest.raises(ArmError, match=message):
        parse_arm(name)


def test_a_kernel_alone_switches_every_other_kernel_off():
    flags = parse_arm("liger:rms_norm").liger_flags("llama")
    assert flags["rms_norm"] is True
    assert not any(on for kernel, on in flags.items() if kernel != "rms_norm")
    assert set(flags) == set(kernel_switches("llama"))  # read from Liger's own patch function
    assert parse_arm("liger").liger_flags("llama") == {}  # Liger's defaults


def test_liger_arms_on_a_model_type_liger_cannot_patch_are_refused_alone():
    """The liger conditions end as errors naming the reason; the baseline still runs."""
    training = TrainingArgs(model_name="random:tiny-gpt2")
    runs = plan_runs(
        ExperimentArgs(arm=["liger", "liger:rope", "baseline"], per_device_train_batch_size=[1]), training, 1
    )
    refused = {r.training_args.arm: r.refused for r in runs}
    assert refused["baseline"] == ""
    for arm in ("liger", "liger:rope"):
        assert f"arm {arm!r}: Liger has no kernels for model type 'gpt2'" in refused[arm]
        assert "the others are" in refused[arm]


def test_a_kernel_the_model_type_lacks_is_refused_for_that_condition():
    runs = plan_runs(ExperimentArgs(arm=["liger:geglu", "baseline"], per_device_train_batch_size=[]), TrainingArgs(), 1)
    assert "no 'geglu' kernel for model type 'llama'" in runs[0].refused and runs[1].refused == ""


INPUTS_DIR = Path(__file__).resolve().parents[2] / "inputs"
FRONTIER_KEYS = {"arms", "batch_size_search", "seq_length_search", "probes"}
KERNEL_KEYS = {"sweep"}
BENCHMARK_INPUTS = sorted(
    path
    for path in INPUTS_DIR.glob("*.yaml")
    if not (FRONTIER_KEYS | KERNEL_KEYS) & set(yaml.safe_load(path.read_text()))
)
KERNEL_INPUTS = sorted(path for path in INPUTS_DIR.glob("*.yaml") if "sweep" in yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", BENCHMARK_INPUTS, ids=[p.stem for p in BENCHMARK_INPUTS])
def test_every_benchmark_inputs_file_plans(path):
    inputs = yaml.safe_load(path.read_text())
    planned = plan_runs(
        ExperimentArgs(**inputs.get("experiment_args", {})),
        TrainingArgs(**inputs.get("training_args", {})),
        inputs.get("n_runs", 1),
    )
    assert planned and not any(run.refused for run in planned)


def test_the_convergence_files_are_one_run_on_generated_and_on_real_data():
    synthetic, real = (
        yaml.safe_load((INPUTS_DIR / f"convergence_tinyllama_{name}.yaml").read_text())
        for name in ("synthetic", "alpaca")
    )
    assert {k: v for k, v in synthetic.items() if k != "training_args"} == {
        k: v for k, v in real.items() if k != "training_args"
    }
    source_keys = {"model_name", "dataset_name", "learning_rate"}  # from scratch on generated data, fine-tuned on real
    differing = {
        k for k in synthetic["training_args"].keys() | real["training_args"].keys() if not k.startswith("synthetic_")
    }
    differing = {k for k in differing if synthetic["training_args"].get(k) != real["training_args"].get(k)}
    assert differing == source_keys
    args = TrainingArgs(**synthetic["training_args"])
    # long enough for the loss to fall well below its start, with a held-out set evaluated along the way
    assert args.max_steps >= 200 and args.eval_examples > 0 and 0 < args.eval_steps < args.max_steps
    assert synthetic["experiment_args"]["arm"] == ["liger", "baseline"]


@pytest.mark.parametrize("path", KERNEL_INPUTS, ids=[p.stem for p in KERNEL_INPUTS])
def test_every_kernel_inputs_file_is_valid(path):
    from finetune_bench.kernels.settings import KernelBenchmarkSettings

    inputs = yaml.safe_load(path.read_text())
    assert set(inputs) == {"sweep"}
    KernelBenchmarkSettings(**inputs["sweep"]).check()
