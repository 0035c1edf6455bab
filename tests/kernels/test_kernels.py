"""The kernel benchmark on a CPU: its cases compute what their references compute, a sweep gives a row per point
whatever happens, the comparison and report read the rows right, and the workflow runs end to end.

Liger's kernels run in the Triton interpreter here, at tiny-llama's shapes: the times mean nothing."""

import importlib.metadata
import json
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pandas as pd
import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.kernels.report import (
    against_published,
    build_kernel_report,
    comparison,
    nothing_measured,
    releases,
    releases_summary,
    summary,
)
from finetune_bench.kernels.run import run_kernel_in_child
from finetune_bench.kernels.settings import (
    KERNELS,
    KernelBenchmarkSettings,
    check_software_sets_install,
    kernels_not_benchmarked,
    kernels_to_run,
    liger_kernels_shipped,
)
from finetune_bench.measuring.environment import lock_digest
from tests.reporting.test_wide_tables import needs_chromium, table_widths

# Liger's benchmark data columns (benchmark/data/all_benchmark_data.csv in linkedin/Liger-Kernel), in order.
LIGER_COLUMNS = [
    "kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "metric_unit", "x_name", "x_label",
    "x_value", "y_value_50", "y_value_20", "y_value_80", "extra_benchmark_config_str", "gpu_name", "liger_version",
]  # fmt: skip


def tiny(**overrides) -> KernelBenchmarkSettings:
    return KernelBenchmarkSettings(**{"model": "tiny-llama", "tokens": [8, 16], "device": "cpu", **overrides})


def test_every_problem_of_a_sweep_is_reported_at_once():
    with pytest.raises(SpecError) as caught:
        KernelBenchmarkSettings(
            kernels=["rmsnorm"], model="llama-4", tokens=[0], modes=["sideways"], dtype="int8", rep_ms=0
        ).check()
    message = str(caught.value)
    for expected in (
        "sweep.kernels: 'rmsnorm' is not a kernel here (did you mean 'rms_norm'?)",
        "sweep.model: 'llama-4' is not a bundled architecture",
        "sweep.tokens must be a non-empty list of positive integers, got [0]",
        "sweep.modes: 'sideways' is not a mode",
        "sweep.dtype must be one of",
        "sweep.rep_ms must be a positive integer, got 0",
    ):
        assert expected in message
    assert kernels_to_run(KernelBenchmarkSettings()) == list(KERNELS)
    assert kernels_to_run(KernelBenchmarkSettings(kernels=["rope", "rms_norm"])) == ["rms_norm", "rope"]


# Kernels whose Liger implementation does not run in the Triton interpreter (checked on a GPU only).
NOT_INTERPRETABLE = {"dyt": "its launcher asks Triton's GPU driver for the device, which the interpreter lacks"}


def test_every_kernel_here_is_one_liger_ships_and_the_rest_are_named():
    shipped = liger_kernels_shipped()
    assert set(KERNELS) <= set(shipped)  # named as Liger names its kernels (liger_kernel/ops/<kernel>.py)
    missing = kernels_not_benchmarked()
    assert missing and not set(missing) & set(KERNELS) and set(missing) | set(KERNELS) == set(shipped)


def test_each_kernel_computes_what_its_reference_computes():
    script = Path(__file__).parent / "scripts" / "kernel_parity.py"
    kernels = [kernel for kernel in KERNELS if kernel not in NOT_INTERPRETABLE]
    done = subprocess.run(
        [sys.executable, str(script), *kernels], capture_output=True, text=True, timeout=600, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == set(kernels)
    for kernel, difference in found.items():
        assert difference["output_scale"] > 0, kernel
        assert difference["output"] <= 1e-4 * max(difference["output_scale"], 1.0), (kernel, difference)
        assert difference["grad"] <= 1e-4, (kernel, difference)


def test_a_sweep_gives_a_row_per_point_in_liger_s_columns(tmp_path):
    rows = run_kernel_in_child(tiny(kernels=["rms_norm"]), "rms_norm", tmp_path)
    assert list(rows.columns[: len(LIGER_COLUMNS)]) == LIGER_COLUMNS
    # 2 providers × 2 sizes × 3 modes × 2 metrics
    assert len(rows) == 24 and (rows["status"] == "ok").all()
    # when each point was measured, and the lockfile the software came from (the report's header names both)
    assert rows["measured_at"].str.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC").all()
    assert (rows["lock_sha256"] == lock_digest()).all()
    assert set(rows["kernel_provider"]) == {"liger", "huggingface"} and set(rows["x_value"]) == {8, 16}
    speed, memory = rows[rows["metric_name"] == "speed"], rows[rows["metric_name"] == "memory"]
    assert (speed["y_value_50"] > 0).all() and (speed["metric_unit"] == "ms").all()
    assert memory["y_value_50"].isna().all() and (memory["reason"] == "no memory figure on a CPU").all()
    config = json.loads(rows["extra_benchmark_config_str"].iloc[0])
    assert config["hidden_size"] == 64 and config["dtype"] == "torch.bfloat16"


def test_a_sweep_that_runs_out_of_time_keeps_a_row_for_every_point(tmp_path):
    rows = run_kernel_in_child(tiny(kernels=["swiglu"], timeout_s=1), "swiglu", tmp_path)
    assert len(rows) == 24
    assert (rows["status"] == "timeout").all()
    assert rows["reason"].str.contains("did not finish within timeout_s 1").all()


def _gpu_rows() -> pd.DataFrame:
    """Rows as a GPU run writes them: Liger twice as fast and at half the memory for rms_norm, slower and heavier
    for rope, and one point that ran out of memory."""
    rows = []
    for kernel, reference, speed, memory in (("rms_norm", "huggingface", 2.0, 0.5), ("rope", "huggingface", 0.5, 1.5)):
        for x in (1024, 2048):
            for mode in ("forward", "full"):
                for provider, time_ms, mb in (
                    (reference, 1.0 * x / 1024, 100.0),
                    ("liger", x / 1024 / speed, 100 * memory),
                ):
                    for metric, unit, value in (("speed", "ms", time_ms), ("memory", "MB", mb)):
                        rows.append(
                            dict(
                                kernel_name=kernel,
                                kernel_provider=provider,
                                kernel_operation_mode=mode,
                                metric_name=metric,
                                metric_unit=unit,
                                x_name="T",
                                x_label="sequence length",
                                x_value=x,
                                y_value_50=value,
                                y_value_20=value,
                                y_value_80=value,
                                gpu_name="NVIDIA H100 80GB HBM3",
                                device="cuda:0",
                                status="ok",
                                reason="",
                            )  # fmt: skip
                        )
    rows.append({**rows[-1], "x_value": 8192, "y_value_50": None, "status": "oom", "reason": "out of memory: CUDA"})
    return pd.DataFrame(rows)


def test_comparison_summary_and_report_read_the_rows():
    rows = _gpu_rows()
    compared = comparison(rows)
    rms_full = compared[(compared["kernel_name"] == "rms_norm") & (compared["kernel_operation_mode"] == "full")]
    assert rms_full["speedup"].dropna().tolist() == [2.0, 2.0]
    assert rms_full["memory_ratio"].dropna().tolist() == [0.5, 0.5]
    table = summary(compared).set_index("kernel")
    assert table.loc["rms_norm", "Liger is"] == "faster, leaner"
    assert table.loc["rope", "Liger is"] == "slower, heavier"
    assert table.loc["rope", "speedup (full pass)"] == "×0.50–0.50"  # at both sizes
    report = build_kernel_report(rows, "llama-3-8b", ["jsd", "tvd"])
    assert list(report.sections) == ["Summary", "Speed", "Memory", "Figures", "Failures", "Rows"]
    assert "NVIDIA H100 80GB HBM3" in report.sections["Summary"] and "CPU run" not in report.sections["Summary"]
    assert "out of memory: CUDA" in report.sections["Failures"]
    assert "not benchmarked here (no reference case): jsd, tvd" in report.sections["Summary"]
    assert report.sections["Speed"].count("data:image/png;base64,") == 1


def test_the_report_opens_with_what_was_measured():
    config = {"model": "llama-3-8b", "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "dtype": "torch.bfloat16"}  # fmt: skip
    rows = _gpu_rows().assign(
        extra_benchmark_config_str=json.dumps(config),
        liger_version="0.8.5",
        lock_sha256="12ab43339895acd68ee9ca0f24045b651d0ea26c",
        measured_at=lambda frame: ["2026-11-27 09:00 UTC"] * (len(frame) - 1) + ["2026-11-27 09:02 UTC"],
    )
    sweep = KernelBenchmarkSettings(warmup_ms=25, rep_ms=100)
    report = build_kernel_report(rows, "llama-3-8b", sweep=sweep, inputs_file="inputs/kernels_llama3_8b.yaml")
    summary = report.sections["Summary"]
    # the answer at a glance (a card per kernel), then what was measured
    assert summary.startswith('<div class="cards"><div class="card">')
    assert summary.index('<div class="measured"><details><summary><b>What was measured</b>') < summary.index("</ul>")
    assert dict(re.findall(r"<li>(.*?): (.*?)</li>", summary.split("</ul>", 1)[0])) == {
        "hardware": "NVIDIA H100 80GB HBM3",
        "model": "llama-3-8b (hidden 4,096, MLP 14,336, vocabulary 128,256, heads 32, KV heads 8, head size 128)",
        "dtype": "bfloat16",
        "tokens": "1024, 2048, 8192",
        "passes": "forward, full",
        "timing": "speed: triton.testing.do_bench, 25 ms warm-up and 100 ms of calls per point; memory: the peak "
        "allocated over 10 calls",
        "measured": "2026-11-27 09:00 UTC to 2026-11-27 09:02 UTC",
        "versions": "liger-kernel 0.8.5, lockfile sha256 12ab43339895",
        "inputs file": "inputs/kernels_llama3_8b.yaml",
    }


def test_a_cpu_sweep_s_header_says_cpu_and_leaves_out_what_its_rows_do_not_carry():
    rows = _gpu_rows().assign(gpu_name="cpu", device="cpu").drop(columns=["x_value"])
    summary = unescape(build_kernel_report(rows.assign(x_value=8)).sections["Summary"])
    header = dict(re.findall(r"<li>(.*?): (.*?)</li>", summary.split("</ul>", 1)[0]))
    assert header == {"hardware": "CPU (Liger's kernels in the Triton interpreter)", "tokens": "8",
                      "passes": "forward, full"}  # fmt: skip


@needs_chromium
def test_at_1400_px_no_table_of_the_kernel_report_scrolls_sideways(tmp_path):
    rows = _gpu_rows().assign(extra_benchmark_config_str='{"model": "llama-3-8b", "hidden_size": 4096}')
    report = build_kernel_report(rows, "llama-3-8b")
    assert "every row: all " in report.sections["Rows"]  # the shapes, GPU and version behind the toggle
    widths = table_widths(report.to_html(), tmp_path)
    assert {w["section"] for w in widths} == {"summary", "figures", "failures", "rows"}
    assert [w for w in widths if w["scroll"] > w["client"]] == []


def test_the_workflow_runs_a_sweep_end_to_end():
    from workflows.kernels import kernel_benchmark

    rows, compared, report = kernel_benchmark(sweep=tiny(kernels=["layer_norm"], tokens=[8], modes=["full"]))
    assert len(rows) == 4 and (rows["status"] == "ok").all()  # 2 providers × speed and memory
    assert compared["speedup"].notna().sum() == 1
    html = Path(report.path).read_text()
    assert "CPU run" in html and "not benchmarked here" in html


def test_points_are_set_beside_liger_s_published_rows_of_the_same_gpu():
    ours = _gpu_rows()
    published = ours[ours["status"] == "ok"].copy()
    published["y_value_50"] = published["y_value_50"] * 2  # everything twice as slow / heavy there
    published["liger_version"] = "0.6.0"
    other_gpu = published.assign(gpu_name="NVIDIA A100-SXM4-80GB", y_value_50=99.0)
    matched = against_published(ours, pd.concat([published, other_gpu]))
    assert set(matched["published_gpu"]) == {"NVIDIA H100 80GB HBM3"}  # the same GPU's rows, the A100's left out
    assert (matched["liger_ours_over_published"] == 0.5).all()
    speed = matched[matched["metric_name"] == "speed"]
    assert (speed["speedup"] == speed["speedup_published"]).all()  # both sides twice as slow: the same speedup
    assert len(matched) == 16  # 2 kernels × 2 sizes × 2 modes × 2 metrics
    report = build_kernel_report(ours, "llama-3-8b", published=published)
    assert "0.6.0" in report.sections["Against Liger's data"]


def test_a_comparison_file_that_is_not_there_is_refused():
    with pytest.raises(SpecError, match="sweep.compare_with: '/nowhere/data.csv' is not a file"):
        KernelBenchmarkSettings(compare_with="/nowhere/data.csv").check()


def test_liger_s_older_provider_names_model_sweeps_and_versions_are_read_right():
    ours = _gpu_rows()
    ok = ours[ours["status"] == "ok"].drop(columns=["status", "reason", "device"])
    old = ok.assign(liger_version="0.2.1", y_value_50=ok["y_value_50"] * 10)  # an older version, far off
    new = ok.assign(liger_version="0.6.0")
    # Liger's older data names every reference "huggingface"; the model-config sweeps put a model name in x_value
    renamed = pd.concat([old, new]).replace({"kernel_provider": {"torch": "huggingface"}})
    models = new.head(2).assign(x_name="model_config", x_value="llama_3_8b")
    matched = against_published(ours, pd.concat([renamed, models], ignore_index=True))
    assert set(matched["published_liger_version"]) == {"0.6.0"}  # the newest where both measured a point
    assert matched["speedup_published"].notna().sum() == 8 and (matched["liger_ours_over_published"] == 1).all()


def test_each_software_set_runs_the_sweep_in_a_child_that_imports_its_release(tmp_path, monkeypatch):
    from finetune_bench.sources import software

    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    software.prepare.cache_clear()
    sweep = tiny(kernels=["rms_norm"], tokens=[8], modes=["full"], software_sets=["", "liger-kernel==0.8.2"])
    rows = run_kernel_in_child(sweep, "rms_norm", tmp_path / "run")
    software.prepare.cache_clear()
    assert (rows["status"] == "ok").all()
    versions = rows.groupby("software_set")["liger_version"].unique().to_dict()
    assert {name: list(found) for name, found in versions.items()} == {
        "": [importlib.metadata.version("liger-kernel")],
        "liger-kernel==0.8.2": ["0.8.2"],
    }


def test_a_set_that_does_not_install_is_refused_when_the_sweep_is_planned():
    sweep = tiny(software_sets=["liger-kernel==9.9.9"])
    with pytest.raises(SpecError, match=r"sweep.software_sets 'liger-kernel==9.9.9': uv could not install"):
        check_software_sets_install(sweep)
    with pytest.raises(SpecError, match="is not a pin"):
        KernelBenchmarkSettings.from_mapping({"software_sets": ["liger-kernel=0.8"]})


def test_each_set_s_liger_kernel_is_compared_with_the_reference_set_s():
    older = _gpu_rows().assign(software_set="liger-kernel==0.8.2", liger_version="0.8.2")
    newer = _gpu_rows().assign(software_set="", liger_version="0.8.5")
    liger = newer["kernel_provider"] == "liger"
    speed = newer["metric_name"] == "speed"
    newer.loc[liger & speed, "y_value_50"] /= 2  # the installed release's Liger kernels twice as fast
    rows = pd.concat([older, newer], ignore_index=True)  # the older set first: it is the reference
    paired = releases(rows)
    full_speed = paired[(paired["kernel_operation_mode"] == "full") & (paired["metric_name"] == "speed")]
    assert set(full_speed["software_set"]) == {"installed packages"}
    assert set(full_speed["reference"]) == {"liger-kernel==0.8.2"}
    assert full_speed["speedup"].tolist() == [2.0] * 4  # two kernels at two sizes
    table = releases_summary(paired).set_index("kernel")
    assert table.loc["rms_norm", "the set's kernel is"] == "faster, about as lean"
    assert table.loc["rms_norm", "liger-kernel"] == "0.8.5 vs 0.8.2"
    report = build_kernel_report(rows, "llama-3-8b")
    assert "Releases" in report.sections and "0.8.5 vs 0.8.2" in report.sections["Summary"]
    assert releases(newer).empty  # one set: nothing to compare


def test_a_sweep_whose_every_kernel_failed_is_reported_and_named():
    """Two software sets on a machine where every kernel child failed (no GPU): the report is built, nothing is
    compared, and what failed is said (the kernel task then exits non-zero with it)."""
    failed = _gpu_rows().assign(status="error", reason="RuntimeError: 0 active drivers", y_value_50=float("nan"))
    rows = pd.concat(
        [failed.assign(software_set="liger-kernel==0.8.2"), failed.assign(software_set="")], ignore_index=True
    )
    assert releases(rows).empty
    build_kernel_report(rows, "llama-3-8b")
    said = nothing_measured(rows)
    assert said.startswith("no kernel was measured, every one failed (") and "0 active drivers" in said
    assert nothing_measured(_gpu_rows()) == ""
