"""The metrics table: one row per run-level metric, consistent with itself, with the results table and with the
per-step table; and the one formula of the rates."""

import pytest

from finetune_bench.analysis.tables import METRIC_COLUMNS
from finetune_bench.measuring.metrics import (
    DERIVED,
    GIB,
    MAX,
    MEMORY_PHASES,
    METRICS,
    RANK_ONLY,
    TOTALS,
    Metric,
    throughput,
)
from finetune_bench.measuring.step_table import STEP_COLUMNS


def test_the_table_names_exactly_the_results_table_s_metric_columns():
    columns = [metric.column for metric in METRICS.values() if metric.column is not None]
    assert len(columns) == len(set(columns))
    assert sorted(columns) == sorted(METRIC_COLUMNS)
    assert all(metric.column_unit == "GiB" for metric in METRICS.values() if metric.scale == GIB)


def test_what_the_rank_merge_reads_is_in_the_table():
    for metric in METRICS.values():
        if metric.rate_of or metric.total_of:
            assert METRICS[metric.rate_of or metric.total_of].ranks == RANK_ONLY, metric.name  # a rank's own totals
        # a memory peak, with its spread over the ranks (a memory phase's peak: the largest rank's alone)
        if metric.ranks == MAX and metric.unit == "bytes" and not any(f"_{p}_" in metric.name for p in MEMORY_PHASES):
            assert METRICS[f"{metric.name}_spread"].ranks == DERIVED
    assert set(TOTALS) == {
        "measured_time_s", "steady_time_s", "measured_tokens", "measured_padded_tokens", "measured_model_flops",
        "measured_energy_j",
    }  # fmt: skip


def test_a_row_with_an_unknown_merge_is_refused():
    with pytest.raises(ValueError, match="energy_per_token_j: merge 'median'"):
        Metric("energy_per_token_j", "J", "median", "energy per token")


def test_throughput_is_the_totals_over_the_time():
    totals = {"measured_tokens": 300.0, "measured_padded_tokens": 400.0, "measured_model_flops": 6e12}
    assert throughput(totals, 2.0) == {
        "tokens_per_second": 150.0,
        "padded_tokens_per_second": 200.0,
        "achieved_tflops": 3.0,
        "padding_fraction": 0.25,
    }
    assert throughput({"measured_tokens": 0.0, "measured_padded_tokens": 0.0}, 1.0)["padding_fraction"] == 0.0


def test_the_per_step_columns_keep_their_order_in_steps_csv():
    assert STEP_COLUMNS == (
        "step", "step_time_s", "non_padding_tokens", "padded_tokens", "batch_shape", "new_shape", "model_flops", "loss",
        "eval_loss", "peak_allocated_bytes", "peak_reserved_bytes", "gc_time_s", "cuda_mallocs", "cuda_malloc_retries",
        "triton_compiles", "triton_compile_s", "triton_kernels_compiled", "jit_cache_bytes", "energy_j", "is_warmup",
    )  # fmt: skip
