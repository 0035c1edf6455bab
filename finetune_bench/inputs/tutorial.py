"""The Union tutorial's keys and what each becomes in this project: the one table that the conversion of a tutorial
inputs file (`finetune_bench.inputs.migrate`), the CLI's hint for such a file and the message for each such key
(`finetune_bench.inputs.sections.check_section`) read.

The tutorial (and Hugging Face's `TrainingArguments`, which it passes its settings on to) names things its own way:
`use_liger`, `dataset`, `bf16`, `num_train_epochs`, ...
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml


def flow(value: Any) -> str:
    """A value as YAML writes it inline (`[true, false]`, `bfloat16`)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


@dataclass(frozen=True)
class TutorialKey:
    """One key of the tutorial's `training_args` / `experiment_args` and what it becomes here."""

    key: str
    # The setting it becomes (None: none; it is left out, and `why` says why nothing is lost).
    setting: str | None
    # Its values mapped to the setting's (DROP: that value is left out; a value missing here cannot be converted);
    # empty: the value is kept as it is.
    values: Mapping[Any, Any] = field(default_factory=dict)
    why: str = ""

    @property
    def suggestion(self) -> str:
        """What the message for this key, unknown here, adds: the setting it means, or why none is needed."""
        if self.setting is None:
            return f" (nothing to set here: {self.why})"
        examples = [
            f"{self.key}: {flow(k)} is {self.setting}: {flow(v)}" for k, v in self.values.items() if v is not DROP
        ]
        return f" (did you mean {self.setting!r}?{''.join(' ' + e for e in examples[:1])})"


# A value that the table maps to nothing: the key is left out, and that is all it takes.
DROP = object()


_LIGER = {True: "liger", False: "baseline"}
# The one table: the conversion, the CLI's hint and each key's message read it.
TUTORIAL_KEYS = {
    entry.key: entry
    for entry in (
        TutorialKey("use_liger", "arm", _LIGER, "liger on/off is the arm"),
        TutorialKey("use_liger_kernel", "arm", _LIGER, "liger on/off is the arm"),
        TutorialKey("dataset", "dataset_name"),
        TutorialKey("max_length", "max_seq_length"),
        TutorialKey("bf16", "dtype", {True: "bfloat16", False: DROP}, "bf16: false leaves dtype at auto"),
        TutorialKey("fp16", "dtype", {True: "float16", False: DROP}, "fp16: false leaves dtype at auto"),
        TutorialKey(
            "num_train_epochs",
            None,
            why="every run trains max_steps optimizer steps; the fine-tune the report projects is the top-level "
            "fine_tune_epochs, which make migrate sets from it",
        ),
        TutorialKey(
            "eval_strategy",
            None,
            {"no": DROP},
            "held-out evaluation is off unless eval_examples is set, see docs/settings.md",
        ),
        TutorialKey("save_strategy", None, why="a run writes no checkpoints: it is measured and recorded"),
        TutorialKey("output_dir", None, why="the outputs go where the workflow puts them (FINETUNE_BENCH_EXPORT_DIR)"),
        TutorialKey("logging_steps", None, why="every step is recorded"),
        TutorialKey("include_num_input_tokens_seen", None, why="every run counts its non-padding tokens"),
        TutorialKey(
            "report_to",
            None,
            why="runs are logged to W&B when WANDB_ENTITY and the wandb_api_key secret are set, see docs/cluster.md",
        ),
    )
}
