"""The frontier's list-valued input (`arms`) refuses a list's usual slips, read from a file and called from Python;
a section of another workflow's inputs points at the frontier's own."""

import pytest

from finetune_bench.frontier.planning import _check_arms, plan_searches
from finetune_bench.frontier.settings import BatchSizeSearch, FrontierArm, ProbeSettings, SeqLengthSearch
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.reading import read_inputs
from finetune_bench.inputs.settings import TrainingArgs

INTERFACE = {
    "arms": (list[FrontierArm] | None, None),
    "n_runs": (int, 1),
}


def problems(data: dict) -> list[str]:
    return read_inputs(data, INTERFACE, "memory_frontier").problems


def test_a_bare_arm_is_one_message_saying_how_to_list_it():
    assert problems({"arms": "liger"}) == ["arms must be a list, got 'liger': write arms: [{arm: liger}]"]


def test_an_on_off_mapping_of_arms_lists_the_wanted_ones():
    (problem,) = problems({"arms": {"liger": True, "baseline": False}})
    assert "arms must be a list, got the mapping" in problem and "(arms: [{arm: liger}])" in problem


def test_arms_written_null_is_refused_as_a_list_left_empty():
    """`arms: ~`, or every item commented out: the CLI could not convert it (a framework traceback); leaving `arms`
    out is what gives the default arms."""
    assert problems({"arms": None}) == [
        "arms is null (is every item commented out?): write a list, e.g. arms: [{arm: liger}, {arm: baseline}], or "
        "leave arms out for its default"
    ]
    assert problems({"n_runs": 2}) == [], "arms left out is its default"


def test_arms_written_as_names_say_how_to_write_an_item():
    assert problems({"arms": ["liger", "compile"]}) == [
        "arms[0] must be a mapping, got 'liger': write `- arm: liger` (or {arm: liger} inside [...])",
        "arms[1] must be a mapping, got 'compile': write `- arm: compile` (or {arm: compile} inside [...])",
    ]


def test_an_empty_item_and_an_empty_arm_are_each_named():
    found = problems({"arms": [{"arm": None}, {"arm": "liger"}, None]})
    assert "arms[0].arm must be str, got None (left empty: write its value, or remove arm for its default)" in found
    assert any(p.startswith("arms[2] is null (an item left empty, or its value commented out?)") for p in found)
    assert len(found) == 2


def test_an_arm_left_as_an_empty_mapping_is_named_not_read_as_the_baseline():
    (problem,) = problems({"arms": [{"arm": "liger"}, {}]})
    assert problem.startswith(
        "arms[1] is an empty mapping (its settings commented out?): write it, e.g. `- arm: <name>`"
    )


def test_a_nested_list_of_arms_is_named():
    (problem,) = problems({"arms": [[{"arm": "liger"}]]})
    assert problem.startswith("arms[0] is a nested list")


def test_arms_called_from_python_are_checked_too():
    with pytest.raises(SpecError, match="arms must be a list, got 'liger'"):
        _check_arms("liger")


def test_the_benchmarks_experiment_args_point_at_the_frontiers_own_sections():
    (problem,) = problems({"experiment_args": {"arm": ["liger", "baseline"]}})
    assert problem.startswith("experiment_args is not an input of memory_frontier: it is a section of ")
    assert "its arms go under arms: ([{arm: liger}, {arm: baseline}])" in problem


def test_a_training_setting_at_the_top_points_at_its_section():
    interface = {**INTERFACE, "training_args": (TrainingArgs, None)}
    (problem,) = read_inputs({"max_steps": 4}, interface, "memory_frontier").problems
    assert problem == (
        "max_steps is not an input of memory_frontier: it is a setting of training_args; write it under training_args:"
    )


FRONTIER_INTERFACE = {
    "training_args": (TrainingArgs, None),
    "arms": (list[FrontierArm] | None, None),
    "batch_size_search": (BatchSizeSearch, None),
    "seq_length_search": (SeqLengthSearch, None),
    "probes": (ProbeSettings, None),
}


def test_a_key_in_the_wrong_section_points_at_the_section_that_takes_it():
    found = read_inputs(
        {
            "training_args": {"confirmations": 2, "cap": 64, "max_stepz": 3},
            "probes": {"learning_rate": 1.0e-4},
            "arms": [{"arm": "liger", "dtype": "float32"}],
        },
        FRONTIER_INTERFACE,
        "memory_frontier",
    ).problems
    assert found == [
        "training_args.confirmations is not a setting: it is a setting of probes; write it under probes:",
        "training_args.cap is not a setting: it is a setting of batch_size_search and seq_length_search; write it "
        "under the one it is meant for",
        "training_args.max_stepz is not a setting (did you mean 'max_steps'?)",
        "probes.learning_rate is not a setting: it is a setting of training_args; write it under training_args:",
        "arms[0].dtype is not a setting: it is a setting of training_args; write it under training_args:",
    ]


def test_every_refused_arm_is_named_when_read_and_when_planned():
    read = problems({"arms": [{"arm": "ligr"}, {"arm": "liger"}, {"arm": "cce+baseline"}]})
    assert [p.split(":")[0] for p in read] == ["arms[0].arm", "arms[2].arm"]
    with pytest.raises(SpecError) as error:
        _check_arms([FrontierArm(arm="ligr"), FrontierArm(arm="liger"), FrontierArm(arm="cce+baseline")])
    assert [p.split(":")[0] for p in error.value.problems] == ["arms[0].arm", "arms[2].arm"]


def test_a_refused_probe_count_does_not_hide_the_others_and_is_not_compared():
    found = read_inputs(
        {"probes": {"max_steps": "two", "timing_warmup_steps": 5, "retries": -1}},
        FRONTIER_INTERFACE,
        "memory_frontier",
    ).problems
    assert found == ["probes.max_steps must be int, got 'two'", "probes.retries must be at least 0, got -1"]


def test_an_arm_that_cannot_run_on_the_model_is_refused_naming_it_not_a_traceback():
    """The benchmark runs the other conditions of a grid beside one it refuses alone; the frontier searches each arm,
    and a liger arm on a model type Liger cannot patch would end every probe as an error."""
    training_args = TrainingArgs(
        model_name="random:tiny-gpt2", backend="plain_loop", synthetic_min_words=64, synthetic_max_words=80
    )
    arms = [FrontierArm(arm="baseline"), FrontierArm(arm="liger:rope")]
    with pytest.raises(SpecError) as error:
        plan_searches(
            training_args,
            arms,
            BatchSizeSearch(start=1, cap=2),
            SeqLengthSearch(enabled=False),
            ProbeSettings(max_steps=2, timing_warmup_steps=1),
        )
    assert type(error.value) is SpecError, "the inputs are refused, not one condition"
    (problem,) = error.value.problems
    assert problem.startswith("arms[1]: arm 'liger:rope': Liger has no kernels for model type 'gpt2'")
    assert problem.endswith(
        "; the memory frontier cannot search this arm (its every probe would end as an error): leave it out of arms"
    )
    assert "This condition is not run" not in problem


def test_a_training_args_value_the_search_replaces_is_refused_naming_where_to_set_it():
    training_args = TrainingArgs(
        model_name="random:tiny-llama", backend="plain_loop", per_device_train_batch_size=8,
        synthetic_min_words=64, synthetic_max_words=80,
    )  # fmt: skip
    with pytest.raises(SpecError) as error:
        plan_searches(
            training_args,
            [FrontierArm(arm="baseline")],
            BatchSizeSearch(enabled=False),
            SeqLengthSearch(batch_size=1, start=32, cap=64, granularity=32),
            ProbeSettings(max_steps=2, timing_warmup_steps=1),
        )
    assert error.value.problems == [
        "training_args.per_device_train_batch_size 8: the max_seq_length search trains at its own "
        "seq_length_search.batch_size (1), not at this value; set seq_length_search.batch_size: 8, or leave "
        "per_device_train_batch_size out of training_args"
    ]


def _planned(training: dict, batch: BatchSizeSearch, seq: SeqLengthSearch, measure_throughput: bool = False) -> None:
    training_args = TrainingArgs(
        model_name="random:tiny-llama", backend="plain_loop", synthetic_min_words=64, synthetic_max_words=80, **training
    )
    probes = ProbeSettings(max_steps=2, timing_warmup_steps=1)
    plan_searches(training_args, [FrontierArm(arm="baseline")], batch, seq, probes, 1, measure_throughput)


BATCH = BatchSizeSearch(start=1, cap=4)
SEQ = SeqLengthSearch(batch_size=1, start=32, cap=64, granularity=32)
NO_BATCH, NO_SEQ = BatchSizeSearch(enabled=False), SeqLengthSearch(enabled=False)


@pytest.mark.parametrize(
    ("training", "batch", "seq", "refused"),
    [
        # every probe trains probes.max_steps: training_args' steps are the throughput runs' alone
        (dict(max_steps=50), BATCH, SEQ, "training_args.max_steps 50 acts only in the throughput runs"),
        (dict(timing_warmup_steps=3, max_steps=8), BATCH, NO_SEQ, "training_args.max_steps 8 acts only in the"),
        # the sequence-length search probes its own lengths: only a batch-size search probes at max_seq_length
        (dict(max_seq_length=48), NO_BATCH, SEQ, "training_args.max_seq_length 48 acts only with a batch-size search"),
        # the batch-size search probes its own sizes
        (
            dict(per_device_train_batch_size=4),
            BATCH,
            NO_SEQ,
            "training_args.per_device_train_batch_size 4: the batch-size search probes its own sizes, from "
            "batch_size_search.start (1) to batch_size_search.cap (4), and the throughput runs train at the frontiers "
            "it finds, never at this value; to start the search there, set batch_size_search.start: 4, or leave "
            "per_device_train_batch_size out of training_args",
        ),
    ],
)
def test_a_training_args_value_the_probes_replace_is_refused_naming_what_decides(training, batch, seq, refused):
    with pytest.raises(SpecError) as error:
        _planned(training, batch, seq)
    found = [problem for problem in error.value.problems if problem.startswith(refused)]
    assert len(found) == 1, error.value.problems
    if " acts only " in refused:
        assert "nothing this frontier runs trains at it, so it would change nothing" in found[0]


def test_a_training_args_value_the_frontier_trains_at_is_kept():
    """max_steps with throughput runs (their steps); max_seq_length with a batch-size search (it probes at it); a batch
    equal to the sequence-length search's own (what that search trains at)."""
    _planned(dict(max_steps=50, timing_warmup_steps=5), BATCH, SEQ, measure_throughput=True)
    _planned(dict(max_seq_length=48), BATCH, SEQ)
    at_two = SeqLengthSearch(batch_size=2, start=32, cap=64, granularity=32)
    _planned(dict(per_device_train_batch_size=2), BATCH, at_two)
    _planned(dict(per_device_train_batch_size=2), NO_BATCH, at_two)
