"""The memory-frontier search (against a fake probe), its validation, its report, and the workflow end to end."""

import dataclasses
import math
import os
import subprocess
import sys
from html import unescape
from pathlib import Path

import pandas as pd
import pytest
import yaml

from finetune_bench.frontier.planning import plan_searches
from finetune_bench.frontier.report import build_frontier_report
from finetune_bench.frontier.search import (
    BISECTION,
    CONFIRMATION,
    DOUBLING,
    FOUND,
    NOTHING_FITS,
    PROBE_FAILED,
    REACHED_CAP,
    Guide,
    ProbeOutcome,
    search_frontier,
)
from finetune_bench.frontier.settings import (
    BATCH_SIZE,
    SEQ_LENGTH,
    BatchSizeSearch,
    FrontierArm,
    FrontierSearch,
    ProbeSettings,
    SeqLengthSearch,
    frontier_arms,
)
from finetune_bench.frontier.tables import frontier_ratios, frontier_table, probes_table
from finetune_bench.frontier.throughput import plan_throughput_runs
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun, RunSettings
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.running.faults import FAKE_MEMORY_ENV, fake_memory_cost

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
# Generated data long and plentiful enough for every search below.
ROOMY_DATA = TrainingArgs(synthetic_num_examples=512, synthetic_min_words=40000, synthetic_max_words=40001)


def make_search(dimension=BATCH_SIZE, start=1, cap=256, granularity=1, retries=1, confirmations=1, liger=False):
    return FrontierSearch(
        arm=FrontierArm(arm="liger" if liger else "baseline"),
        dimension=dimension,
        training_args=dataclasses.replace(
            ROOMY_DATA, max_steps=2, timing_warmup_steps=1, arm="liger" if liger else "baseline"
        ),
        start=start,
        cap=cap,
        granularity=granularity,
        retries=retries,
        confirmations=confirmations,
        timeout_s=60,
    )


class FakeProbe:
    """Fits up to `threshold` along `dimension` (ok, with a peak proportional to the size), OOM above.

    `failures` maps a size to the outcomes its first tries give instead (e.g. ["error"]); `wall_time`
    gives each probe's wall time from its size."""

    def __init__(self, threshold, dimension=BATCH_SIZE, failures=None, wall_time=lambda value: 1.0 + value / 10):
        self.threshold, self.dimension, self.wall_time = threshold, dimension, wall_time
        self.failures = {value: list(outcomes) for value, outcomes in (failures or {}).items()}
        self.calls: list[int] = []

    def __call__(self, args: TrainingArgs) -> ProbeOutcome:
        value = getattr(args, self.dimension)
        self.calls.append(value)
        wall = self.wall_time(value)
        if self.failures.get(value):
            status = self.failures[value].pop(0)
            return ProbeOutcome(status=status, reason=f"injected {status}", wall_time_s=wall, error_tail="Traceback")
        if value > self.threshold:
            return ProbeOutcome(status="oom", reason="out of memory at step 1", wall_time_s=wall)
        return ProbeOutcome(
            status="ok",
            wall_time_s=wall,
            peak_reserved_bytes=value * GIB,
            peak_allocated_bytes=value * GIB * 0.9,
            environment={"gpu_memory_bytes": str(300 * GIB), "device_type": "cuda", "gpu_name": "Fake GPU"},
        )


def phases(result):
    return [p.phase for p in result.probes]


# --- the search -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 13, 16, 100, 255])
def test_doubling_then_bisection_finds_the_exact_frontier(threshold):
    probe = FakeProbe(threshold)
    result = search_frontier(make_search(start=1, cap=256), probe)
    assert result.status == FOUND
    assert (result.frontier, result.first_oom) == (threshold, threshold + 1)
    # Doubling: 1, 2, ..., 2^k fit and 2^(k+1) does not; bisection halves (2^k, 2^(k+1)) k times; one re-probe.
    k = int(math.log2(threshold))
    assert phases(result).count(DOUBLING) == k + 2
    assert phases(result).count(BISECTION) == k
    assert phases(result) == [DOUBLING] * (k + 2) + [BISECTION] * k + [CONFIRMATION]
    assert result.probes_used == len(result.probes) == len(probe.calls) == 2 * k + 3
    assert result.probes[-1].value == threshold and result.probes[-1].status == "ok"
    assert str(threshold) in result.reason and str(threshold + 1) in result.reason


def test_nothing_fits():
    result = search_frontier(make_search(start=4, cap=64), FakeProbe(threshold=2))
    assert result.status == NOTHING_FITS
    assert result.frontier is None and result.first_oom == 4
    assert result.probes_used == 1
    assert "nothing fits" in result.reason and "per_device_train_batch_size=4" in result.reason


def test_everything_up_to_the_cap_fits():
    probe = FakeProbe(threshold=10_000)
    result = search_frontier(make_search(start=1, cap=100), probe)
    assert result.status == REACHED_CAP
    assert result.frontier == 100 and result.first_oom is None
    assert probe.calls == [1, 2, 4, 8, 16, 32, 64, 100, 100]
    assert "cap" in result.reason


def test_non_power_of_two_start():
    probe = FakeProbe(threshold=20)
    result = search_frontier(make_search(start=3, cap=100), probe)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, 20, 21)
    assert probe.calls[:4] == [3, 6, 12, 24]
    assert min(probe.calls) == 3


def test_sequence_length_respects_the_granularity():
    probe = FakeProbe(threshold=3000, dimension=SEQ_LENGTH)
    result = search_frontier(make_search(SEQ_LENGTH, start=256, cap=32768, granularity=256), probe)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, 2816, 3072)
    assert all(value % 256 == 0 for value in probe.calls)
    assert probe.calls[:5] == [256, 512, 1024, 2048, 4096]


def test_a_flaky_probe_is_retried():
    probe = FakeProbe(threshold=13, failures={8: ["error"], 12: ["timeout"]})
    result = search_frontier(make_search(retries=1), probe)
    assert (result.status, result.frontier) == (FOUND, 13)
    retried = [(p.value, p.attempt, p.status) for p in result.probes if p.value in (8, 12)]
    assert retried == [(8, 1, "error"), (8, 2, "ok"), (12, 1, "timeout"), (12, 2, "ok")]
    assert result.probes_used == 2 * 3 + 3 + 2


def test_a_probe_that_keeps_failing_stops_the_search_with_a_lower_bound():
    probe = FakeProbe(threshold=13, failures={16: ["error"] * 3})
    result = search_frontier(make_search(retries=2), probe)
    assert result.status == PROBE_FAILED
    assert result.frontier == 8  # the best fit so far, never more
    assert probe.calls == [1, 2, 4, 8, 16, 16, 16]
    assert "per_device_train_batch_size=16 failed 3 time(s)" in result.reason
    assert "injected error" in result.reason and "lower bound" in result.reason


def test_a_failing_first_probe_reports_no_frontier():
    result = search_frontier(make_search(retries=0), FakeProbe(threshold=13, failures={1: ["timeout"]}))
    assert result.status == PROBE_FAILED and result.frontier is None
    assert "no size was seen to fit" in result.reason


def test_a_frontier_whose_every_search_failed_fails_naming_each_reason():
    from finetune_bench.frontier.search import SEARCHES_FAILED, failed_searches

    search = make_search(retries=0)
    failed = search_frontier(search, FakeProbe(threshold=13, failures={1: ["error"]}))
    problems = failed_searches([search, search], [failed, None])
    assert len(problems) == 1 and problems[0].startswith(SEARCHES_FAILED)
    assert "failed 1 time(s)" in problems[0] and "no result (the search's task failed)" in problems[0]
    # one search that measured anything (a frontier, the cap, or even nothing fitting) is an answer
    found = search_frontier(search, FakeProbe(threshold=13))
    nothing_fits = search_frontier(search, FakeProbe(threshold=0))
    assert failed_searches([search, search], [failed, found]) == []
    assert failed_searches([search, search], [failed, nothing_fits]) == []


def test_a_failed_frontier_ends_the_workflow_non_zero():
    import click

    from finetune_bench.frontier.search import SEARCHES_FAILED
    from tasks.analysis import require_nothing_lost

    with pytest.raises(click.ClickException, match="every search failed") as raised:
        require_nothing_lost(problems=[f"{SEARCHES_FAILED}: ...\n  - liger (max_seq_length): CUDA error"])
    assert "kept measured results from being stored" not in raised.value.message


def test_out_of_memory_is_not_retried():
    probe = FakeProbe(threshold=1)
    search_frontier(make_search(start=1, cap=2, retries=3), probe)
    assert probe.calls == [1, 2, 1]


def test_a_confirmation_that_runs_out_of_memory_moves_the_frontier_down():
    # 13 fits during the bisection, then runs out of memory when re-probed.
    probe = FakeProbe(threshold=13)
    real = probe.__call__

    def flaky_memory(args):
        outcome = real(args)
        if args.per_device_train_batch_size == 13 and probe.calls.count(13) == 2:
            return ProbeOutcome(status="oom", reason="out of memory at step 2", wall_time_s=1.0)
        return outcome

    result = search_frontier(make_search(), flaky_memory)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, 12, 13)
    confirmations = [(p.value, p.status) for p in result.probes if p.phase == CONFIRMATION]
    assert confirmations == [(13, "oom"), (12, "ok")]


def test_a_confirmation_that_runs_out_of_memory_continues_the_bisection_below_it():
    # 16 fits once while doubling (then 32 does not), bisection settles on 16, its re-probe runs out of
    # memory: the search continues between 8 (the last fit below) and 16.
    probe = FakeProbe(threshold=16)
    real = probe.__call__

    def flaky_memory(args):
        if args.per_device_train_batch_size == 16 and probe.calls.count(16) >= 1:
            probe.calls.append(16)
            return ProbeOutcome(status="oom", reason="out of memory", wall_time_s=1.0)
        return real(args)

    result = search_frontier(make_search(), flaky_memory)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, 15, 16)
    assert [p.value for p in result.probes if p.phase == BISECTION][-3:] == [12, 14, 15]


def test_a_start_that_fits_once_then_not_means_nothing_fits():
    calls = []

    def probe(args):
        calls.append(args.per_device_train_batch_size)
        status = "ok" if len(calls) == 1 else "oom"
        return ProbeOutcome(status=status, wall_time_s=1.0)

    result = search_frontier(make_search(start=2, cap=8), probe)
    assert (result.status, result.frontier) == (NOTHING_FITS, None)
    assert "re-probed" in result.reason


@pytest.mark.parametrize("confirmations", [0, 2])
def test_confirmation_count(confirmations):
    result = search_frontier(make_search(confirmations=confirmations), FakeProbe(threshold=5))
    assert result.frontier == 5
    assert phases(result).count(CONFIRMATION) == confirmations


def test_gpu_time_is_the_sum_of_probe_wall_times():
    result = search_frontier(make_search(), FakeProbe(threshold=13, failures={4: ["error"]}))
    assert result.device_seconds == pytest.approx(sum(1.0 + p.value / 10 for p in result.probes))
    assert result.device_seconds == pytest.approx(sum(p.wall_time_s for p in result.probes))


# --- planning and validation ------------------------------------------------------------------------------


def plan(**changes):
    inputs = dict(
        training_args=ROOMY_DATA,
        arms=[FrontierArm(arm="liger"), FrontierArm(arm="baseline")],
        batch_size_search=BatchSizeSearch(start=1, cap=128),
        seq_length_search=SeqLengthSearch(batch_size=2, start=1024, cap=32768, granularity=256),
        probes=ProbeSettings(),
    )
    inputs.update(changes)
    return plan_searches(**inputs)


def test_plan_lists_a_search_per_arm_and_dimension():
    searches = plan()
    assert [(s.arm.arm, s.dimension) for s in searches] == [
        ("liger", BATCH_SIZE),
        ("liger", SEQ_LENGTH),
        ("baseline", BATCH_SIZE),
        ("baseline", SEQ_LENGTH),
    ]
    for search in searches:
        assert search.training_args.arm == search.arm.arm
        assert (search.training_args.max_steps, search.training_args.timing_warmup_steps) == (2, 1)
    by_dimension = {s.dimension: s for s in searches}
    assert by_dimension[SEQ_LENGTH].training_args.per_device_train_batch_size == 2
    assert (by_dimension[SEQ_LENGTH].granularity, by_dimension[BATCH_SIZE].granularity) == (256, 1)
    assert [s.dimension for s in plan(seq_length_search=SeqLengthSearch(enabled=False))] == [BATCH_SIZE] * 2


@pytest.mark.parametrize(
    "changes, key",
    [
        (dict(batch_size_search=BatchSizeSearch(start=0, cap=8)), "batch_size_search.start"),
        (dict(batch_size_search=BatchSizeSearch(start=8, cap=4)), "batch_size_search.cap"),
        (dict(seq_length_search=SeqLengthSearch(start=1024, cap=4096, granularity=0)), "seq_length_search.granularity"),
        (dict(seq_length_search=SeqLengthSearch(start=1000, cap=4096, granularity=256)), "seq_length_search.start"),
        (dict(seq_length_search=SeqLengthSearch(start=1024, cap=512)), "seq_length_search.cap"),
        (dict(seq_length_search=SeqLengthSearch(batch_size=0)), "seq_length_search.batch_size"),
        (dict(probes=ProbeSettings(retries=-1)), "probes.retries"),
        (dict(probes=ProbeSettings(confirmations=-1)), "probes.confirmations"),
        (dict(probes=ProbeSettings(max_steps=0)), "probes.max_steps"),
        (dict(probes=ProbeSettings(max_steps=2, timing_warmup_steps=2)), "probes.timing_warmup_steps"),
        (dict(probes=ProbeSettings(timeout_s=0)), "probes.timeout_s"),
        (dict(arms=[]), "arms"),
        (dict(arms=[FrontierArm(arm="liger"), FrontierArm(arm="liger")]), "arms"),
        (dict(arms=[FrontierArm(arm="yes")]), "arms[0].arm: arm 'yes'"),
        (
            dict(batch_size_search=BatchSizeSearch(enabled=False), seq_length_search=SeqLengthSearch(enabled=False)),
            "enabled",
        ),
        (dict(training_args=dataclasses.replace(ROOMY_DATA, max_seq_length=0)), "training_args.max_seq_length"),
        (dict(training_args=dataclasses.replace(ROOMY_DATA, criterion="trl", backend="plain_loop")), "criterion"),
        (dict(training_args=dataclasses.replace(ROOMY_DATA, synthetic_num_examples=64)), "synthetic_num_examples"),
        (
            dict(training_args=dataclasses.replace(ROOMY_DATA, synthetic_min_words=8000, synthetic_max_words=9000)),
            "synthetic_min_words",
        ),
    ],
)
def test_bad_inputs_name_the_key(changes, key):
    with pytest.raises(SpecError, match=key.replace("[", r"\[").replace("]", r"\]")):
        plan(**changes)


def test_every_problem_of_the_frontier_inputs_is_reported_at_once():
    with pytest.raises(SpecError) as refused:
        plan(
            arms=[],
            batch_size_search=BatchSizeSearch(start=8, cap=4),
            seq_length_search=SeqLengthSearch(batch_size=0),
            probes=ProbeSettings(retries=-1, max_steps=2, timing_warmup_steps=2),
            training_args=dataclasses.replace(ROOMY_DATA, max_seq_length=0),
        )
    text = str(refused.value)
    for key in ("arms", "batch_size_search.cap", "seq_length_search.batch_size", "probes.retries",
                "probes.timing_warmup_steps", "training_args.max_seq_length"):  # fmt: skip
        assert key in text, text
    assert text.startswith("6 problems in the inputs")


def test_a_search_that_runs_has_its_settings_checked_and_one_that_does_not_is_refused_its_settings():
    assert [s.dimension for s in plan(batch_size_search=BatchSizeSearch(enabled=False))] == [SEQ_LENGTH] * 2
    with pytest.raises(SpecError) as refused:  # set where the search does not run: they would change nothing
        plan(batch_size_search=BatchSizeSearch(enabled=False, start=0, cap="many"))
    assert [p.split(" acts only")[0] for p in refused.value.problems] == [
        "batch_size_search.start 0",
        "batch_size_search.cap 'many'",
    ]
    assert "acts only with the search enabled (enabled: true), and the search is disabled" in refused.value.problems[0]
    with pytest.raises(SpecError) as refused:
        plan(seq_length_search=SeqLengthSearch(batch_size=0, start=0, granularity=1.5))
    assert refused.value.problems == [
        "seq_length_search.batch_size must be at least 1, got 0",
        "seq_length_search.start must be at least 1, got 0",
        "seq_length_search.granularity must be an integer, got 1.5",
    ]
    with pytest.raises(SpecError, match="^batch_size_search.enabled must be true or false, got 'no'$"):
        plan(batch_size_search=BatchSizeSearch(enabled="no", start=0))


@pytest.mark.parametrize(
    "cls, text, message",
    [
        (BatchSizeSearch, '{"strat": 1}', "batch_size_search.strat is not a setting (did you mean 'start'?)"),
        (BatchSizeSearch, '{"cap": "64"}', "batch_size_search.cap must be int, got '64'"),
        (SeqLengthSearch, '{"granularity": 256.5}', "seq_length_search.granularity must be int, got 256.5"),
        (ProbeSettings, '{"retries": true}', "probes.retries must be int, got True"),
        (FrontierArm, '{"arm": true}', "arms[].arm must be str, got True"),
        (FrontierArm, '{"liger": true}', "arms[].liger is not a setting"),
    ],
)
def test_inputs_file_sections_are_strict(cls, text, message):
    """What `pyflyte run --inputs-file` builds these inputs with rejects what dataclasses_json would let through."""
    import click

    with pytest.raises(click.BadParameter) as raised:
        cls.from_json(text)
    assert message in str(raised.value)
    assert BatchSizeSearch.from_json('{"start": 2}') == BatchSizeSearch(start=2)


def batch_result(liger, threshold, cap=64):
    return search_frontier(make_search(cap=cap, liger=liger), FakeProbe(threshold))


def test_throughput_runs_at_each_frontier_and_at_the_largest_batch_every_arm_fits():
    results = [batch_result(True, 40), batch_result(False, 20), None]
    arms = [FrontierArm(arm="liger"), FrontierArm(arm="baseline")]
    runs = plan_throughput_runs(results, ROOMY_DATA, arms, n_runs=2)
    points = [(r.run_number, r.training_args.arm, r.training_args.per_device_train_batch_size) for r in runs]
    assert points == [
        (0, "liger", 40), (0, "liger", 20), (0, "baseline", 20), (1, "liger", 40), (1, "liger", 20), (1, "baseline", 20)
    ]  # fmt: skip
    assert all(r.training_args.max_steps == ROOMY_DATA.max_steps for r in runs)
    assert runs[0].swept_axes == ["arm", BATCH_SIZE]
    assert runs[0].condition_id == "arm=liger,per_device_train_batch_size=40"
    # An arm where nothing fits gets no run, and there is no batch every arm fits.
    nothing = plan_throughput_runs([batch_result(True, 40), batch_result(False, 0)], ROOMY_DATA, arms, n_runs=1)
    assert [(r.training_args.arm, r.training_args.per_device_train_batch_size) for r in nothing] == [("liger", 40)]


# --- the report -------------------------------------------------------------------------------------------


def test_report_shows_frontiers_ratios_and_every_probe_outcome():
    searches = [
        make_search(BATCH_SIZE, cap=256, liger=True),
        make_search(BATCH_SIZE, cap=256, liger=False),
        make_search(SEQ_LENGTH, start=256, cap=4096, granularity=256, liger=True),
        make_search(SEQ_LENGTH, start=256, cap=4096, granularity=256, liger=False),
    ]
    results = [
        search_frontier(searches[0], FakeProbe(48, failures={32: ["timeout"]})),
        search_frontier(searches[1], FakeProbe(24, failures={16: ["error"]})),
        search_frontier(searches[2], FakeProbe(10**6, dimension=SEQ_LENGTH)),
        None,  # a lost search task
    ]
    frontiers = frontier_table(searches, results)
    assert list(frontiers["frontier"].astype(object).where(frontiers["frontier"].notna(), None)) == [
        48,
        24,
        4096,
        None,
    ]
    assert list(frontiers["status"]) == [FOUND, FOUND, REACHED_CAP, "lost"]
    assert frontiers.loc[0, "peak_reserved_gib"] == pytest.approx(48)
    assert frontiers.loc[0, "peak_reserved_share_of_gpu"] == pytest.approx(48 / 300)
    ratios = frontier_ratios(frontiers).set_index("dimension")
    assert ratios.loc[BATCH_SIZE, "ratio"] == pytest.approx(2.0)
    probes = probes_table(results)
    assert set(probes["status"]) == {"ok", "oom", "error", "timeout"}
    assert len(probes) == sum(r.probes_used for r in results if r is not None)

    html = build_frontier_report(searches, results).to_html(title="Memory frontier")
    assert html.count("data:image/png;base64,") == 1
    assert "Largest batch size at max_seq_length=32: liger 48 (batch 49 runs out of memory)" in html
    assert "With liger, batch size 48 trains where the baseline runs out of memory (from batch 25)" in html
    assert "Fake GPU (300 GiB)" in html and "GPU seconds in all" in html and "simulated" not in html
    assert "≥ 4096 (reached the cap)" in html
    assert "injected timeout" in html and "injected error" in html
    assert "the search task failed" in html
    assert "measure_throughput is off" in html


def test_report_includes_throughput_at_the_frontier():
    from finetune_bench.analysis.grid import analyze_grid

    searches = [make_search(liger=True), make_search(liger=False)]
    results = [search_frontier(s, FakeProbe(8 if s.arm.arm == "liger" else 4)) for s in searches]
    runs = plan_throughput_runs(results, ROOMY_DATA, [s.arm for s in searches], n_runs=1)
    outcomes = [
        RunResult(
            condition_id=run.condition_id,
            run_number=run.run_number,
            swept_axes=run.swept_axes,
            training_args=run.training_args,
            status="ok",
            metrics={"tokens_per_second": 1000.0 * run.training_args.per_device_train_batch_size},
            details={"device": "cuda:0"},
        )
        for run in runs
    ]
    html = build_frontier_report(searches, results, analyze_grid(runs, outcomes, {})).to_html()
    assert "liger vs baseline: throughput ×" in html and "over 1 condition(s)" in html
    assert html.count("data:image/png;base64,") >= 2


# --- the workflow -----------------------------------------------------------------------------------------


def smoke_inputs() -> dict:
    return yaml.safe_load((PROJECT_ROOT / "inputs" / "frontier_smoke.yaml").read_text())


def test_smoke_yaml_is_the_embedded_default():
    from workflows.frontier import memory_frontier

    defaults = memory_frontier.python_interface.default_inputs_as_kwargs
    inputs = smoke_inputs()
    assert set(inputs) <= set(defaults) | {"arms"}  # arms default to None: DEFAULT_ARMS
    assert TrainingArgs(**inputs["training_args"]) == defaults["training_args"]
    assert [FrontierArm(**arm) for arm in inputs["arms"]] == frontier_arms(defaults.get("arms"))
    assert BatchSizeSearch(**inputs["batch_size_search"]) == defaults["batch_size_search"]
    assert SeqLengthSearch(**inputs["seq_length_search"]) == defaults["seq_length_search"]
    assert ProbeSettings(**inputs["probes"]) == defaults["probes"]
    for key in ("measure_throughput", "n_runs"):
        assert inputs[key] == defaults[key]


@pytest.mark.parametrize(
    "name",
    [
        "frontier_llama1b_2048",
        "frontier_llama1b_4096",
        "frontier_phi3_512",
        "frontier_llama1b_a100_40gb",
        "frontier_llama3_8b_fsdp4",
    ],
)
def test_gpu_inputs_are_valid(name):
    inputs = yaml.safe_load((PROJECT_ROOT / "inputs" / f"{name}.yaml").read_text())
    searches = plan_searches(
        TrainingArgs(**inputs["training_args"]),
        [FrontierArm(**arm) for arm in inputs["arms"]],
        BatchSizeSearch(**inputs["batch_size_search"]),
        SeqLengthSearch(**inputs.get("seq_length_search", {})),
        ProbeSettings(**inputs["probes"]),
        inputs.get("n_runs", 1),
        inputs["measure_throughput"],
    )
    assert {s.arm.arm for s in searches} == {"liger", "baseline"}
    # the capped ones answer what fits, not how fast
    assert inputs["measure_throughput"] is not ("a100" in name or "fsdp4" in name)


def test_dynamic_body_compiles_to_a_map_over_every_search():
    from flytekit.types.directory import FlyteDirectory

    from tests.workflows.compiled import compile_dynamic
    from workflows.frontier import run_searches

    spec = compile_dynamic(
        run_searches,
        searches=plan(),
        dataset_dir=FlyteDirectory("s3://bucket/dataset"),
        model_dir=FlyteDirectory("s3://bucket/model"),
        execution=RunSettings(concurrency=2, min_success_ratio=1.0),
    )
    (node,) = spec.nodes
    assert node.array_node.to_flyte_idl().parallelism == 2
    assert set(node.array_node.to_flyte_idl().bound_inputs) == {"dataset_dir", "model_dir"}


def run_smoke(tmp_path: Path, inputs: dict, fake_memory_tokens: int) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """`pyflyte run` the workflow on `inputs` with the fake memory model; the exported frontiers, probes, report."""
    inputs_file = tmp_path / "inputs.yaml"
    inputs_file.write_text(yaml.safe_dump(inputs))
    export = tmp_path / "export"
    # W&B off (tests/integrations/test_wandb_logging.py is where its logging is checked): no W&B service to start
    env = dict(
        os.environ,
        FINETUNE_BENCH_EXPORT_DIR=str(export),
        FLYTECTL_CONFIG=str(PROJECT_ROOT / "flyte-local.yaml"),
        WANDB_MODE="disabled",
        **{FAKE_MEMORY_ENV: str(fake_memory_tokens)},
    )
    pyflyte = Path(sys.executable).parent / "pyflyte"
    completed = subprocess.run(
        [str(pyflyte), "run", "workflows/frontier.py", "memory_frontier", "--inputs-file", str(inputs_file)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return pd.read_csv(export / "frontiers.csv"), pd.read_csv(export / "probes.csv"), export / "frontier_report.html"


def expected_frontier(inputs: dict, liger: bool, dimension: str, tokens: int) -> int:
    """The largest size the fake memory model lets through, within the search's range."""
    if dimension == BATCH_SIZE:
        search, seq = inputs["batch_size_search"], inputs["training_args"]["max_seq_length"]
        sizes = range(search["start"], search["cap"] + 1)
        fits = [b for b in sizes if fake_memory_cost(b, seq, liger) <= tokens]
    else:
        search = inputs["seq_length_search"]
        sizes = range(search["start"], search["cap"] + 1, search["granularity"])
        fits = [s for s in sizes if fake_memory_cost(search["batch_size"], s, liger) <= tokens]
    return max(fits)


def check_frontiers(frontiers: pd.DataFrame, probes: pd.DataFrame, inputs: dict, tokens: int) -> None:
    for row in frontiers.itertuples():
        assert row.frontier == expected_frontier(inputs, row.arm == "liger", row.dimension, tokens), row
        cap = inputs["batch_size_search" if row.dimension == BATCH_SIZE else "seq_length_search"]["cap"]
        assert row.status == (REACHED_CAP if row.frontier == cap else FOUND)
        assert row.probes_used == len(probes[(probes["arm"] == row.arm) & (probes["dimension"] == row.dimension)])
    assert set(probes["status"]) <= {"ok", "oom"}, probes[["arm", "value", "status", "reason"]].to_string()


# Fake memory limit (batch × sequence length, doubled without liger) for the smoke inputs: at sequence
# length 32 liger fits batch 2 and the baseline batch 1; at batch 1 liger fits sequence 64 (the cap), the
# baseline 32.
SMOKE_TOKENS = 64


def test_workflow_finds_the_baseline_frontiers_and_measures_throughput_there(tmp_path):
    """The baseline arm alone through `pyflyte run` (fast: no Triton interpreter), then its throughput at
    its batch frontier through the benchmark's train task."""
    inputs = smoke_inputs()
    # Kept short: no re-probes (the search tests cover them), 2-step throughput runs.
    inputs.update(arms=[{"arm": "baseline"}], measure_throughput=True, n_runs=1)
    inputs["probes"]["confirmations"] = 0
    inputs["training_args"].update(max_steps=2, timing_warmup_steps=1)
    frontiers, probes, report = run_smoke(tmp_path, inputs, SMOKE_TOKENS)
    assert list(frontiers["dimension"]) == [BATCH_SIZE, SEQ_LENGTH]
    assert list(frontiers["frontier"]) == [1, 32]
    check_frontiers(frontiers, probes, inputs, SMOKE_TOKENS)
    throughput = pd.read_csv(report.parent / "throughput.csv")
    assert list(throughput["condition_id"]) == ["arm=baseline,per_device_train_batch_size=1"]
    assert list(throughput["status"]) == ["ok"] and (throughput["tokens_per_second"] > 0).all()
    assert (throughput["steps_completed"] == 2).all()
    text = report.read_text()
    assert "Largest batch size at max_seq_length=32: baseline 1 (batch 2 runs out of memory" in text
    assert "Simulated out of memory." in text and "CPU seconds in all" in text and "GPU seconds" not in text
    assert "Full-length runs" in text
    assert text.count("data:image/png;base64,") >= 2


@pytest.mark.slow
def test_workflow_finds_a_larger_liger_frontier(tmp_path):
    """Both arms of the smoke inputs through `pyflyte run` (minutes: liger runs in the Triton interpreter)."""
    inputs = smoke_inputs()
    frontiers, probes, report = run_smoke(tmp_path, inputs, SMOKE_TOKENS)
    check_frontiers(frontiers, probes, inputs, SMOKE_TOKENS)
    by_arm = frontiers.set_index(["arm", "dimension"])["frontier"]
    assert by_arm[("liger", BATCH_SIZE)] == 2 and by_arm[("baseline", BATCH_SIZE)] == 1
    assert by_arm[("liger", SEQ_LENGTH)] == 64 and by_arm[("baseline", SEQ_LENGTH)] == 32
    assert (
        "With liger, batch size 2 trains where the baseline runs out of memory (from batch 2): ×2.00 the baseline's "
        "frontier (simulated by the fake memory model, not measured)."
    ) in unescape(report.read_text())


def test_child_probe_runs_the_real_worker(tmp_path, tiny_model_dir, tiny_dataset_dir, monkeypatch):
    """A probe is a real child run: the fake memory model ends it as `oom` at its first step."""
    from finetune_bench.frontier.probes import child_probe

    monkeypatch.setenv(FAKE_MEMORY_ENV, "1")
    probe = child_probe(tiny_dataset_dir, tiny_model_dir, tmp_path, timeout_s=120)
    outcome = probe(dataclasses.replace(make_search().training_args, per_device_train_batch_size=2))
    assert outcome.status == "oom", outcome.reason + outcome.error_tail
    assert "out of memory at step 1 (set-up)" in outcome.reason
    assert outcome.wall_time_s > 0
    assert outcome.environment.get("device_type") == "cpu"
    assert (tmp_path / "probe-000" / "condition.json").is_file()


def test_throughput_plan_is_empty_when_not_measured():
    from tasks.frontier import plan_frontier_throughput

    results = [batch_result(True, 4), batch_result(False, 2)]
    arms = [FrontierArm(arm="liger"), FrontierArm(arm="baseline")]
    execution = RunSettings(concurrency=2, results_store="s3://bucket/results")
    inputs = dict(results=results, training_args=ROOMY_DATA, arms=arms, n_runs=1, execution=execution)
    assert plan_frontier_throughput(**inputs, measure_throughput=False).runs == []
    plan = plan_frontier_throughput(**inputs, measure_throughput=True)
    assert all(isinstance(run, PlannedRun) for run in plan.runs) and len(plan.runs) == 3
    assert plan.execution == execution


# --- the guided search ------------------------------------------------------------------------------------


class LinearMemory:
    """A GPU where a size reserves `per_unit` bytes above `fixed`; OOM when that exceeds `limit`."""

    def __init__(self, fixed, per_unit, limit, dimension=BATCH_SIZE):
        self.fixed, self.per_unit, self.limit, self.dimension = fixed, per_unit, limit, dimension
        self.calls: list[int] = []

    def __call__(self, args: TrainingArgs) -> ProbeOutcome:
        value = getattr(args, self.dimension)
        self.calls.append(value)
        peak = self.fixed + self.per_unit * value
        if peak > self.limit:
            return ProbeOutcome(status="oom", reason="out of memory at step 1", wall_time_s=20)
        return ProbeOutcome(status="ok", wall_time_s=20, peak_allocated_bytes=peak / 1.05, peak_reserved_bytes=peak)


def truth(fixed, per_unit, limit, start, cap, granularity=1):
    fits = [v for v in range(start, cap + 1, granularity) if fixed + per_unit * v <= limit]
    return max(fits) if fits else None


@pytest.mark.parametrize(
    "model_error,per_unit_error",
    [(0.0, 0.0), (0.08, 0.1), (-0.08, -0.1), (0.1, -0.1), (-0.1, 0.1), (0.03, -0.05), (-0.05, 0.03)],
)
def test_a_guided_search_finds_the_frontier_in_at_most_four_probes(model_error, per_unit_error):
    """With the memory model within 10 % (in total and in slope), the guided search needs at most 4 probes,
    confirmation included, and finds the frontier the doubling search finds."""
    fixed, per_unit, limit = 30 * GIB, 1.7 * GIB, 78 * GIB
    model = Guide(predict=lambda v: fixed * (1 + model_error) + per_unit * (1 + per_unit_error) * v, limit_bytes=limit)
    guided = search_frontier(make_search(start=8, cap=256), LinearMemory(fixed, per_unit, limit), model)
    doubling = search_frontier(make_search(start=8, cap=256), LinearMemory(fixed, per_unit, limit))
    assert guided.frontier == doubling.frontier == truth(fixed, per_unit, limit, 8, 256)
    assert guided.status == FOUND and guided.first_oom == guided.frontier + 1
    assert guided.probes_used <= 4, [(p.value, p.phase, p.status) for p in guided.probes]
    assert doubling.probes_used > guided.probes_used
    assert guided.predicted_frontier is not None and doubling.predicted_frontier is None


@pytest.mark.parametrize("model_error", [-0.5, 0.6])
def test_a_badly_wrong_model_still_finds_the_frontier(model_error):
    """The model only picks where to probe: far off, the search takes more probes, never a wrong frontier."""
    fixed, per_unit, limit = 20 * GIB, 0.9 * GIB, 78 * GIB
    model = Guide(predict=lambda v: (fixed + per_unit * v) * (1 + model_error), limit_bytes=limit)
    result = search_frontier(make_search(start=1, cap=256), LinearMemory(fixed, per_unit, limit), model)
    assert result.frontier == truth(fixed, per_unit, limit, 1, 256)
    assert result.status == FOUND and result.first_oom == result.frontier + 1


def test_a_guided_sequence_search_stays_on_its_granularity_and_reaches_the_cap():
    fixed, per_unit, limit = 10 * GIB, 0.001 * GIB, 78 * GIB
    gpu = LinearMemory(fixed, per_unit, limit, dimension=SEQ_LENGTH)
    model = Guide(predict=lambda v: fixed + per_unit * v, limit_bytes=limit)
    search = make_search(dimension=SEQ_LENGTH, start=1024, cap=65536, granularity=1024)
    result = search_frontier(search, gpu, model)
    assert result.frontier == truth(fixed, per_unit, limit, 1024, 65536, 1024)
    assert all(v % 1024 == 0 for v in gpu.calls)
    capped = search_frontier(search, LinearMemory(fixed, per_unit, 1000 * GIB, SEQ_LENGTH), model)
    assert capped.status == REACHED_CAP and capped.frontier == 65536 and capped.probes_used <= 3


class SaturatingMemory(LinearMemory):
    """A GPU whose caching allocator fills what it may reserve before a size runs out (it frees its cache and
    retries near the limit, as under FSDP2): a fit reserves the limit whatever it allocates; allocated grows
    `per_unit` a size above `fixed`, and a size runs out when that exceeds `limit` / 1.05."""

    def __call__(self, args: TrainingArgs) -> ProbeOutcome:
        value = getattr(args, self.dimension)
        self.calls.append(value)
        allocated = self.fixed + self.per_unit * value
        if allocated * 1.05 > self.limit:
            return ProbeOutcome(status="oom", reason="out of memory at step 1 (backward)", wall_time_s=20)
        reserved = max(allocated * 1.05, 0.99 * self.limit) if allocated * 1.05 > 0.8 * self.limit else allocated * 1.05
        return ProbeOutcome(status="ok", wall_time_s=20, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved)


@pytest.mark.parametrize("model_error", [0.0, 0.03, -0.03, 0.06])
def test_a_fit_whose_reserve_filled_the_gpu_is_measured_by_its_allocated_peak(model_error):
    """A sequence search (granularity 1,024) where every fit near the limit reserves the whole GPU: the reserve
    says nothing of the next size, the allocated peak against the model's does, and the search still needs at
    most 4 probes with a model within 6 %."""
    fixed, per_unit, limit = 12 * GIB, 3.3 * GIB / 1024, 78 * GIB
    gpu = SaturatingMemory(fixed, per_unit, limit, dimension=SEQ_LENGTH)

    def allocated(v):
        return (fixed + per_unit * v) * (1 + model_error)

    model = Guide(predict=lambda v: allocated(v) * 1.05, limit_bytes=limit, predict_allocated=allocated)
    search = make_search(dimension=SEQ_LENGTH, start=2048, cap=32768, granularity=1024)
    result = search_frontier(search, gpu, model)
    expected = max(v for v in range(2048, 32769, 1024) if (fixed + per_unit * v) * 1.05 <= limit)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, expected, expected + 1024)
    assert result.probes_used <= 4, [(p.value, p.phase, p.status) for p in result.probes]


def test_a_dry_run_counts_the_probes_each_search_would_take_as_its_settings_say():
    """The dry run's GPU time: each search run against the memory model's verdicts (`predicted_probes`), guided or
    doubling as probes.guided says, with probes.confirmations re-probes."""
    from finetune_bench.frontier.predicted import plan_totals, predicted_frontiers, predicted_probes
    from finetune_bench.prediction.grid import target_gpu

    fixed, per_unit, limit = 30 * GIB, 1.7 * GIB, 78 * GIB
    model = Guide(predict=lambda v: fixed + per_unit * v, limit_bytes=limit)
    guided = predicted_probes(make_search(start=8, cap=256), model)
    doubling = predicted_probes(dataclasses.replace(make_search(start=8, cap=256), guided=False), model)
    assert guided <= 4 < doubling
    assert predicted_probes(make_search(start=8, cap=256, confirmations=3), model) == guided + 2
    # the workflow's: a tiny model, whose every size fits an H100 up to the cap
    search = dataclasses.replace(make_search(start=1, cap=4), training_args=TrainingArgs(max_steps=2))
    searches = [search, dataclasses.replace(search, guided=False, confirmations=2)]
    table = predicted_frontiers(searches, target_gpu("H100", 0.0, ""))
    assert table["search"].tolist() == ["guided", "doubling"]
    assert table["predicted_probes"].tolist() == [2, 5]  # the cap, confirmed; 1, 2, 4, confirmed twice
    assert table["predicted_gpu_seconds"].tolist() == [60, 150]
    assert plan_totals(table, target_gpu("H100", 0.0, ""))[-1] == (
        "GPU time: about 210 GPU-seconds (7 probes were the memory model right, 30 s start-up each)"
    )


def test_a_cpu_frontier_s_gpu_kind_is_refused():
    """On a CPU the frontier predicts nothing (as the benchmark's plan): its gpu_kind acts nowhere."""
    from finetune_bench.frontier.predicted import check_prediction_acts

    with pytest.raises(SpecError) as refused:
        check_prediction_acts("H100", 0.0, TrainingArgs(device="cpu"), gpu_here=True)
    (problem,) = refused.value.problems
    assert problem.startswith("gpu_kind 'H100' acts only where the plan predicts for a GPU: training on device cuda")
    check_prediction_acts("H100", 0.0, TrainingArgs(device="auto"), gpu_here=False)
    check_prediction_acts("", 0.0, TrainingArgs(device="cpu"), gpu_here=False)
