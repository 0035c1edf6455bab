"""The kernel benchmark's list-valued settings refuse a list's usual slips with one message each, never a traceback."""

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.kernels.settings import KernelBenchmarkSettings


def refusal(data: dict) -> list[str]:
    with pytest.raises(SpecError) as error:
        KernelBenchmarkSettings.from_mapping(data)
    return error.value.problems


def test_kernels_left_null_is_a_message_not_a_type_error():
    assert refusal({"kernels": None}) == [
        "sweep.kernels is null (is every item commented out?): write a list, e.g. kernels: [rms_norm, swiglu], or "
        "leave kernels out for its default"
    ]


def test_a_nested_list_of_kernels_is_named():
    (problem,) = refusal({"kernels": [["rms_norm", "swiglu"]]})
    assert problem.startswith("sweep.kernels[0] is a nested list, ['rms_norm', 'swiglu']: write the kernel names in")


def test_a_bare_kernel_name_is_one_message_not_one_per_letter():
    assert refusal({"kernels": "rms_norm"}) == [
        "sweep.kernels must be a list, got 'rms_norm': write kernels: [rms_norm]"
    ]


def test_an_on_off_mapping_of_kernels_is_refused_with_the_wanted_names():
    (problem,) = refusal({"kernels": {"rms_norm": False, "swiglu": True}})
    assert "sweep.kernels must be a list, got the mapping" in problem
    assert "list the wanted kernel names instead (kernels: [swiglu])" in problem


@pytest.mark.parametrize("modes", [None, "forward", [["forward"]], {"forward": True}])
def test_modes_have_the_same_strictness(modes):
    (problem,) = refusal({"modes": modes})
    assert problem.startswith("sweep.modes")
    assert "is not a mode" not in problem


def test_a_list_of_kernels_still_reads():
    assert KernelBenchmarkSettings.from_mapping({"kernels": ["rms_norm"]}).kernels == ["rms_norm"]


def test_an_unknown_key_does_not_hide_the_values_refused_beside_it():
    assert refusal({"kernel": ["rope"], "kernels": ["swigl"], "tokens": [0], "warmup_ms": "25"}) == [
        "sweep.kernel is not a setting (did you mean 'kernels'?)",
        "sweep.warmup_ms must be int, got '25'",
        "sweep.kernels: 'swigl' is not a kernel here (did you mean 'swiglu'?); known: ['rms_norm', 'layer_norm', "
        "'rope', 'swiglu', 'geglu', 'cross_entropy', 'fused_linear_cross_entropy', 'fused_add_rms_norm', 'dyt', "
        "'relu_squared', 'kl_div']",
        "sweep.tokens must be a non-empty list of positive integers, got [0]",
    ]


def test_an_architecture_whose_config_names_its_shapes_otherwise_is_refused_before_every_point_errors():
    (problem,) = refusal({"model": "tiny-gpt2"})
    assert problem.startswith(
        "sweep.model: 'tiny-gpt2' (model type 'gpt2') has no hidden_size / intermediate_size / num_attention_heads in "
        "its config, from which the kernels take their shapes: every point would end as an error; use one of ["
    )
    assert "'tiny-llama'" in problem and "'tiny-gpt2'" not in problem.split("use one of")[1]
    assert KernelBenchmarkSettings.from_mapping({"model": "tiny-qwen2"}).model == "tiny-qwen2"


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        (
            None,
            "sweep.tokens is null (is every item commented out?): write a list, e.g. tokens: [1024, 2048], or leave "
            "tokens out for its default",
        ),
        (4096, "sweep.tokens must be a list, got 4096: write tokens: [4096]"),
        (
            {512: True, 1024: False},
            "sweep.tokens must be a list, got the mapping {512: True, 1024: False}: list the wanted token counts "
            "instead (tokens: [512]); one left out is not run",
        ),
        (["2,048"], "sweep.tokens[0] must be int, got '2,048' (a thousands separator: write 2048)"),
    ],
)
def test_token_counts_have_the_same_strictness(tokens, problem):
    assert refusal({"tokens": tokens}) == [problem]


def test_the_time_budgets_on_a_cpu_are_refused():
    """On a CPU each point is timed over a few calls, not by triton.testing.do_bench: warmup_ms and rep_ms act only on
    a GPU. Device cpu is refused when the sweep is read; device auto where the sweep runs (`check_settings_act`)."""
    from finetune_bench.kernels.settings import check_settings_act

    assert refusal({"device": "cpu", "warmup_ms": 50, "rep_ms": 600000}) == [
        f"sweep.{name} {value} acts only on a GPU (device cuda, or auto where a GPU is): on a CPU each point is timed "
        f"over 3 calls, whatever the budgets, and the sweep runs on a CPU (device 'cpu'), so it would change nothing; "
        f"leave it at its default ({default}) or set what it acts with"
        for name, value, default in (("warmup_ms", 50, 25), ("rep_ms", 600000, 100))
    ]
    auto = KernelBenchmarkSettings(rep_ms=1000)
    auto.check()
    with pytest.raises(SpecError, match=r"^sweep.rep_ms 1000 acts only on a GPU .*\(device 'auto', and this machine"):
        check_settings_act(auto, gpu_here=False)
    check_settings_act(auto, gpu_here=True)
    check_settings_act(KernelBenchmarkSettings(device="cuda", rep_ms=1000), gpu_here=False)  # refused as cuda alone
    KernelBenchmarkSettings(device="cpu").check()


def _published(path, kernel="rms_norm", tokens=(1024, 2048), status=None) -> str:
    header = "kernel_name,kernel_provider,kernel_operation_mode,metric_name,metric_unit,x_name,x_value,y_value_50,"
    header += "gpu_name,liger_version" + (",status" if status else "")
    rows = [
        f"{kernel},{provider},full,speed,ms,T,{x},0.1,NVIDIA H100 80GB HBM3,0.8.5" + (f",{status}" if status else "")
        for provider in ("liger", "huggingface")
        for x in tokens
    ]
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def test_compare_with_data_that_shares_no_point_with_the_sweep_is_refused(tmp_path):
    """Compared point by point (kernel, mode, metric, x axis and x value): data of other kernels or token counts would
    compare nothing, after the sweep's GPU time."""
    data = _published(tmp_path / "rms_norm.csv")
    (problem,) = refusal({"kernels": ["swiglu"], "tokens": [16, 32], "device": "cpu", "compare_with": data})
    assert problem == (
        f"sweep.compare_with: {data!r} shares no point with the sweep (a point: kernel, mode, metric, x axis and x "
        "value): it has rms_norm at T 1024, 2048 (full; speed); the sweep measures swiglu at T 16, 32 (backward, "
        "forward, full; speed); nothing would be compared: sweep the kernels, modes and token counts it has, or leave "
        "compare_with out"
    )
    assert refusal({"kernels": ["rms_norm"], "tokens": [16, 32], "compare_with": data})[0].startswith(
        "sweep.compare_with:"
    )
    assert refusal({"kernels": ["rms_norm"], "tokens": [1024], "modes": ["forward"], "compare_with": data})
    KernelBenchmarkSettings(kernels=["rms_norm"], tokens=[16, 1024], compare_with=data).check()  # one point shared
    KernelBenchmarkSettings(tokens=[1024], compare_with=data).check()  # every kernel, rms_norm among them
    # this benchmark's own rows: only those measured count
    failed = _published(tmp_path / "failed.csv", status="error")
    (problem,) = refusal({"kernels": ["rms_norm"], "tokens": [1024], "compare_with": failed})
    assert problem.startswith(f"sweep.compare_with: {failed!r} shares no point with the sweep")
