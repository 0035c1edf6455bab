"""The `attention` and `allocator` settings at planning: their values, the axes they make, and what the settings
alone rule out, refused before anything is downloaded, naming the key and the condition."""

import pytest

from finetune_bench.inputs.catalog import ALLOCATORS, ATTENTIONS
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


def sweep(**axes) -> ExperimentArgs:
    return ExperimentArgs(**{"arm": ["baseline"], **axes})


def refusal(experiment: ExperimentArgs, training: TrainingArgs) -> list[str]:
    with pytest.raises(SpecError) as raised:
        plan_runs(experiment, training, 1)
    return raised.value.problems


def test_both_axes_expand_into_conditions():
    runs = plan_runs(
        sweep(attention=["sdpa", "math", "eager"], allocator=["default", "expandable_segments"]),
        TrainingArgs(),
        n_runs=2,
    )
    assert len(runs) == 3 * 2 * 2
    assert runs[0].swept_axes == ["arm", "attention", "allocator"]
    first_repeat = [(r.training_args.attention, r.training_args.allocator) for r in runs[:6]]
    assert first_repeat == [
        (attention, allocator) for attention in ("sdpa", "math", "eager") for allocator in ALLOCATORS
    ]
    assert runs[1].condition_id == "arm=baseline,attention=sdpa,allocator=expandable_segments"


def test_the_defaults_are_todays_behaviour():
    assert TrainingArgs().attention == "sdpa" == next(iter(ATTENTIONS))
    assert TrainingArgs().allocator == "default" == ALLOCATORS[0]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "attention",
            "flash_attention_2",
            "training_args.attention must be one of ['sdpa', 'eager', 'flash', "
            "'efficient', 'cudnn', 'math'], got 'flash_attention_2'",
        ),
        (
            "allocator",
            "expandable",
            "training_args.allocator must be one of ['default', 'expandable_segments'], got 'expandable'",
        ),
        ("attention", 1, "training_args.attention must be str, got 1"),
    ],
)
def test_an_unknown_value_is_refused_naming_the_choices(key, value, message):
    assert refusal(sweep(), TrainingArgs(**{key: value})) == [message]


def test_an_unknown_axis_value_is_refused_naming_the_axis():
    assert refusal(sweep(attention=["math", "flash2"]), TrainingArgs()) == [
        "experiment_args.attention must be one of ['sdpa', 'eager', 'flash', 'efficient', 'cudnn', 'math'], "
        "got 'flash2'"
    ]


def test_what_the_settings_rule_out_is_refused_every_problem_at_once():
    problems = refusal(
        sweep(attention=["efficient", "cudnn", "math"], allocator=["default", "expandable_segments"]),
        TrainingArgs(device="cpu"),
    )
    assert problems == [
        "training_args.attention 'efficient' with device 'cpu' (in 2 conditions, e.g. condition arm=baseline,"
        "attention=efficient,allocator=default): PyTorch's EFFICIENT_ATTENTION kernel runs on CUDA GPUs only; on a "
        "CPU use attention ['sdpa', 'eager', 'flash', 'math']",
        "training_args.attention 'cudnn' with device 'cpu' (in 2 conditions, e.g. condition arm=baseline,"
        "attention=cudnn,allocator=default): PyTorch's CUDNN_ATTENTION kernel runs on CUDA GPUs only; on a CPU use "
        "attention ['sdpa', 'eager', 'flash', 'math']",
        "experiment_args.allocator 'expandable_segments' acts only on a GPU (device cuda, or auto where there is one: "
        "a CPU run uses no CUDA allocator), and no condition of the grid qualifies, so it would change nothing; leave "
        "it at its default ('default') or set what it acts with",
    ]


def test_flash_in_float32_on_a_gpu_is_refused_and_on_a_cpu_is_not():
    assert refusal(sweep(attention=["flash"]), TrainingArgs(dtype="float32", device="cuda")) == [
        "training_args.attention 'flash' with dtype 'float32' (condition arm=baseline,attention=flash): on a GPU "
        "PyTorch's FLASH_ATTENTION kernel takes dtype ['float16', 'bfloat16'] only; use dtype 'bfloat16' (or "
        "'auto'), or attention 'efficient' or 'math'"
    ]
    # device auto may land on a GPU: refused too
    assert len(refusal(sweep(attention=["flash"]), TrainingArgs(dtype="float32"))) == 1
    # PyTorch's CPU flash kernel takes float32; dtype auto is bfloat16 on a GPU
    assert plan_runs(sweep(attention=["flash"]), TrainingArgs(dtype="float32", device="cpu"), 1)
    assert plan_runs(sweep(attention=["flash"]), TrainingArgs(), 1)


def test_flash_with_packing_on_a_gpu_is_refused():
    assert refusal(sweep(attention=["flash"]), TrainingArgs(packing=True, backend="plain_loop")) == [
        "training_args.attention 'flash' with packing (condition arm=baseline,attention=flash): packed rows reach "
        "SDPA with a block-diagonal attention mask, and PyTorch's FLASH_ATTENTION kernel takes no mask on a GPU; use "
        "packing false, or attention 'sdpa' or 'efficient'"
    ]


def test_the_axes_pass_the_strict_from_json():
    experiment = ExperimentArgs.from_json('{"attention": ["sdpa", "math"], "allocator": ["expandable_segments"]}')
    assert experiment.attention == ["sdpa", "math"]
    assert experiment.allocator == ["expandable_segments"]


def test_the_any_length_switch_is_refused_where_every_batch_carries_a_mask():
    # batch 4 of generated rows: padded, so every attention call carries a mask and cuDNN never takes the switch
    (problem,) = refusal(sweep(), TrainingArgs(device="cuda", per_device_train_batch_size=4, cudnn_any_length=True))
    assert problem.startswith(
        "training_args.cudnn_any_length True acts only where cuDNN's attention meets batches without an attention "
        "mask on a GPU (attention 'sdpa' or 'cudnn', packing false, per_device_train_batch_size 1)"
    )
    for where in (
        {"per_device_train_batch_size": 1, "packing": True, "backend": "trl_sft"},
        {"per_device_train_batch_size": 1, "attention": "efficient"},
        {"per_device_train_batch_size": 1, "device": "cpu"},
    ):
        assert len(refusal(sweep(), TrainingArgs(**{"device": "cuda", "cudnn_any_length": True, **where}))) == 1
    # one row a batch, unpacked, cuDNN's attention possible: it acts, and sweeps as an axis
    runs = plan_runs(
        sweep(cudnn_any_length=[False, True]), TrainingArgs(device="cuda", per_device_train_batch_size=1), 1
    )
    assert [r.training_args.cudnn_any_length for r in runs] == [False, True]
    plan_runs(sweep(), TrainingArgs(per_device_train_batch_size=1, attention="cudnn", cudnn_any_length=True), 1)
