"""A local run never waits for nodes it cannot have: a condition on several nodes is refused at planning outside a
cluster, and planned on one (or in a dry run)."""

import pytest

import tasks.plan
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


def test_several_nodes_are_refused_in_a_local_run_naming_each_key():
    with pytest.raises(SpecError) as error:
        tasks.plan.check_nodes_here(ExperimentArgs(num_nodes=[1, 2, 4]), TrainingArgs())
    assert [p.split(":")[0] for p in error.value.problems] == [
        "experiment_args.num_nodes 2",
        "experiment_args.num_nodes 4",
    ]
    assert "would wait for nodes that never come" in error.value.problems[0]
    with pytest.raises(SpecError, match=r"^training_args\.num_nodes 2: this is a local run"):
        tasks.plan.check_nodes_here(ExperimentArgs(), TrainingArgs(num_nodes=2, parallelism="ddp"))


def test_one_node_passes_locally_and_several_on_a_cluster(monkeypatch):
    tasks.plan.check_nodes_here(ExperimentArgs(num_gpus=[1, 2]), TrainingArgs(parallelism="ddp"))
    # a swept axis replaces the training_args value
    tasks.plan.check_nodes_here(ExperimentArgs(num_nodes=[1]), TrainingArgs(num_nodes=2))
    monkeypatch.setattr(tasks.plan, "on_cluster", lambda: True)
    tasks.plan.check_nodes_here(ExperimentArgs(num_nodes=[1, 2]), TrainingArgs())
