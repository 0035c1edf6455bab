"""Every file in tests/inputs/bad_inputs/ is refused by `pyflyte run` before anything is downloaded or trained,
with a message that names the offending key (the file's `# expect:` line is a regex of that message).

Below its `# expect:` line a file may name its workflow (`# workflow: workflows/kernels.py kernel_benchmark`; the
benchmark's by default) and environment variables to run with (`# env: NAME=value`, `{tmp}` a fresh directory)."""

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAD_INPUTS = sorted((Path(__file__).parent / "bad_inputs").glob("*.yaml"))


BENCHMARK = "workflows/benchmark.py benchmarking_experiment"


def expected_message(path: Path) -> str:
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# expect: "), f"{path.name} has no '# expect:' line"
    return first_line.removeprefix("# expect: ")


def header(path: Path, name: str) -> list[str]:
    """The values of the file's `# <name>: ` lines."""
    prefix = f"# {name}: "
    return [line.removeprefix(prefix) for line in path.read_text().splitlines() if line.startswith(prefix)]


def test_the_corpus_is_large_enough():
    """Every workflow's inputs have files of their own: the frontier's and the kernel benchmark's sections are read
    with the same strictness as the benchmark's, and each class of problem is tried on each."""
    workflows = Counter((header(path, "workflow") or [BENCHMARK])[0] for path in BAD_INPUTS)
    assert workflows[BENCHMARK] >= 150
    assert workflows["workflows/frontier.py memory_frontier"] >= 30
    assert workflows["workflows/kernels.py kernel_benchmark"] >= 25


@pytest.fixture(scope="module")
def pyflyte_run(tmp_path_factory):
    """`pyflyte run workflows/benchmark.py benchmarking_experiment --inputs-file F`, in this process."""
    from click.testing import CliRunner
    from flytekit.clis.sdk_in_container.pyflyte import main

    runner = CliRunner()
    downloads = tmp_path_factory.mktemp("downloads")

    def run(inputs_file: Path):
        (workflow,) = header(inputs_file, "workflow") or [BENCHMARK]
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(ROOT)
            # Anything that got as far as a download would write here.
            patch.setenv("FINETUNE_BENCH_CACHE_DIR", str(downloads))
            for variable in header(inputs_file, "env"):
                name, _, value = variable.partition("=")
                patch.setenv(name, value.replace("{tmp}", str(tmp_path_factory.mktemp("env"))))
            result = runner.invoke(main, ["run", *workflow.split(), "--inputs-file", str(inputs_file)])
        return result, downloads

    return run


@pytest.mark.parametrize("inputs_file", BAD_INPUTS, ids=[p.stem for p in BAD_INPUTS])
def test_bad_inputs_are_refused_naming_the_key(inputs_file, pyflyte_run):
    result, downloads = pyflyte_run(inputs_file)
    assert result.exit_code != 0, result.output
    # Rich boxes wrap long messages over lines between │ borders: compare the words alone.
    text = re.sub(r"[\s│╭╮╰╯─]+", " ", result.output + str(result.exception or ""))
    assert re.search(expected_message(inputs_file), text), text[-1500:]
    assert "Traceback" not in result.output, "a refusal is a few lines, never a framework traceback"
    assert len(text) < 20_000, "a refusal is a few lines, whatever size the values have"
    assert not any(downloads.iterdir()), "something was downloaded or generated before the inputs were refused"


def test_a_50_mb_inputs_file_is_refused_before_it_is_parsed(tmp_path, pyflyte_run):
    """PyYAML would parse such a file for minutes before any check ran. It is refused by its size alone: the file
    ends in a YAML error, which a parse would have reached and reported instead."""
    from tasks.inputs_yaml import MAX_INPUTS_FILE_BYTES

    big = tmp_path / "big.yaml"
    arms = ", ".join(["liger"] * 8_400_000)  # 7 bytes an item: 58.8 MB
    big.write_text(f"training_args:\n  model_name: random:tiny-llama\nexperiment_args:\n  arm: [{arms}]\n  [unclosed\n")
    assert big.stat().st_size > 50 * MAX_INPUTS_FILE_BYTES
    result, downloads = pyflyte_run(big)
    assert result.exit_code != 0, result.output
    text = re.sub(r"[\s│╭╮╰╯─]+", " ", result.output + str(result.exception or ""))
    message = "the inputs file is 56.1 MiB, over the 1.0 MiB an inputs file may have (they are a few KB); refused"
    assert f"Invalid value for '--inputs-file': {message} before it is parsed" in text, text[-1500:]
    assert "yaml error" not in text and "Traceback" not in result.output
    assert not any(downloads.iterdir())
