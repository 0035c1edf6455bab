"""Arms: what is switched on in a condition, as one sweepable value (`TrainingArgs.arm`).

An arm is `baseline`, `baseline_repeat`, or components joined by `+`:

- `liger`: Liger's kernels with Liger's defaults for the model type (`apply_liger_kernel_to_<type>()`);
- `liger:<kernel>`: that one Liger kernel alone, every other kernel off (an ablation), e.g.
  `liger:rope`, `liger:rms_norm`, `liger:swiglu`, `liger:fused_linear_cross_entropy`; the kernel
  names are the switches of Liger's own patch functions;
- `compile`: the model compiled with `torch.compile` (after Liger, so Liger's kernels are compiled in);
- `switchback`: the decoder's linear layers replaced by bitsandbytes' SwitchBack int8 linear layers
  (the `switchback` extra, bitsandbytes 0.49.2, the last release with them; a CUDA GPU only).

`baseline_repeat` trains exactly like `baseline`; listing both asks for an A/A comparison, whose
spread is the noise floor a real difference must clear. Every other arm is compared with `baseline`.
"""

import functools
import inspect
from dataclasses import dataclass

from finetune_bench.inputs.errors import closest

BASELINE = "baseline"
BASELINE_REPEAT = "baseline_repeat"
LIGER = "liger"
COMPILE = "compile"
SWITCHBACK = "switchback"
COMPONENTS = (LIGER, COMPILE, SWITCHBACK)
# Liger's loss kernels: they only act when the model's own forward computes the loss.
LOSS_KERNELS = ("cross_entropy", "fused_linear_cross_entropy")


class ArmError(ValueError):
    """An arm name that cannot be parsed or run; the message names it."""


@dataclass(frozen=True)
class Arm:
    """A parsed arm: which components are on, and for Liger which kernel alone (None: Liger's defaults)."""

    name: str
    liger: bool = False
    liger_kernel: str | None = None
    compile: bool = False
    switchback: bool = False

    @property
    def is_baseline(self) -> bool:
        """Nothing switched on (`baseline` and `baseline_repeat`)."""
        return not (self.liger or self.compile or self.switchback)

    def liger_flags(self, model_type: str) -> dict[str, bool]:
        """Keyword arguments for Liger's patch function of `model_type`: none for Liger's defaults, else
        every switch off but the chosen kernel's."""
        if not self.liger or self.liger_kernel is None:
            return {}
        switches = kernel_switches(model_type)
        if self.liger_kernel not in switches:
            raise ArmError(
                f"arm {self.name!r}: Liger has no {self.liger_kernel!r} kernel for model type {model_type!r}; "
                f"it has {list(switches)}"
            )
        return {switch: switch == self.liger_kernel for switch in switches}


def supported_model_types() -> list[str]:
    """Model types Liger can patch, from Liger's own table."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)


@functools.cache
def kernel_switches(model_type: str) -> tuple[str, ...]:
    """The on/off switches of Liger's patch function for `model_type`, read from Liger's own table."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    function = MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]
    return tuple(name for name, p in inspect.signature(function).parameters.items() if isinstance(p.default, bool))


@functools.cache
def default_kernels(model_type: str) -> tuple[str, ...]:
    """The kernels Liger's patch function for `model_type` switches on by default (the `liger` arm's)."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    function = MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]
    return tuple(name for name, p in inspect.signature(function).parameters.items() if p.default is True)


@functools.cache
def all_kernels() -> tuple[str, ...]:
    """Every kernel switch of any model type Liger can patch, in first-seen order."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    seen: dict[str, None] = {}
    for model_type in MODEL_TYPE_TO_APPLY_LIGER_FN:
        seen.update(dict.fromkeys(kernel_switches(model_type)))
    return tuple(seen)


def parse_arm(name: str) -> Arm:
    """The `Arm` an arm name stands for; `ArmError` naming the fault for a name that means nothing."""
    if not isinstance(name, str) or not name:
        raise ArmError(f"an arm is a non-empty name, got {name!r}")
    if name in (BASELINE, BASELINE_REPEAT):
        return Arm(name=name)
    parts = name.split("+")
    found: dict[str, str] = {}
    for part in parts:
        component, _, kernel = part.partition(":")
        if component not in COMPONENTS:
            raise ArmError(
                f"arm {name!r}: unknown component {part!r}{closest(component, [*COMPONENTS, BASELINE])}; an arm is "
                f"{BASELINE!r}, {BASELINE_REPEAT!r}, or {' / '.join(COMPONENTS)} joined by '+' "
                "(e.g. 'compile+liger', 'liger:rope')"
            )
        if component in found:
            raise ArmError(f"arm {name!r} names {component!r} twice")
        if kernel and component != LIGER:
            raise ArmError(f"arm {name!r}: only liger takes a kernel (liger:<kernel>), got {part!r}")
        if component == LIGER and ":" in part and kernel not in all_kernels():
            raise ArmError(
                f"arm {name!r}: Liger has no kernel {kernel!r}{closest(kernel, list(all_kernels()))}; "
                f"its kernels: {list(all_kernels())}"
            )
        found[component] = kernel
    return Arm(
        name=name,
        liger=LIGER in found,
        liger_kernel=found.get(LIGER) or None,
        compile=COMPILE in found,
        switchback=SWITCHBACK in found,
    )
