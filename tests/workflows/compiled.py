"""The benchmark's dynamic node compiled as its pod compiles it, for the serialization tests."""

from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.core.context_manager import FlyteContextManager
from flytekit.models.dynamic_job import DynamicJobSpec
from flytekit.types.directory import FlyteDirectory

from finetune_bench.inputs.plan import PlannedRun, RunSettings
from finetune_bench.sources.versions import SourceVersions

SETTINGS = SerializationSettings(image_config=ImageConfig.auto_default_image())


def compile_dynamic(dynamic, **inputs) -> DynamicJobSpec:
    """A dynamic node's body over `inputs`, compiled to the spec its pod hands to Flyte. flytekit compiles a dynamic's
    body once per process and keeps it (a pod runs one): every compilation here starts afresh, else a test would be
    handed the body another test compiled on other inputs."""
    dynamic._wf = None
    ctx = FlyteContextManager.current_context().with_serialization_settings(SETTINGS)
    with FlyteContextManager.with_context(ctx) as ctx:
        return dynamic.compile_into_workflow(ctx, dynamic._task_function, **inputs)


def compile_benchmark_dynamic(
    planned: list[PlannedRun], concurrency: int = 2, min_success_ratio: float = 0.5, accelerator: str = ""
) -> DynamicJobSpec:
    """`run_benchmark`'s body over `planned`, compiled to the spec its pod hands to Flyte."""
    from workflows.benchmark import run_benchmark

    return compile_dynamic(
        run_benchmark,
        planned=planned,
        execution=RunSettings(
            concurrency=concurrency,
            min_success_ratio=min_success_ratio,
            condition_timeout_s=60,
            results_store="s3://bucket/results",
            accelerator=accelerator,
        ),
        dataset_dir=FlyteDirectory("s3://bucket/dataset"),
        model_dir=FlyteDirectory("s3://bucket/model"),
        sources=SourceVersions(dataset="d", model="m", dataset_cache_key="d", model_cache_key="m"),
    )
