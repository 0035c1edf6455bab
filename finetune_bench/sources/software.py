"""Software sets: the package releases a run trains with, as one setting (`TrainingArgs.software_set`) that a grid
sweeps like any other ("should I upgrade liger-kernel?").

A set is `""`, the installed packages, or pins joined by commas: `liger-kernel==0.8.2`,
`liger-kernel==0.8.2,transformers==5.17.0`. Only `PINNABLE` packages: ones the project installs whose code is
Python (or, for tokenizers and safetensors, has no CUDA code). torch, triton, bitsandbytes and the CUDA libraries are
the image's (`IMAGE_BOUND`): their builds are made for each other and for the GPU's driver, so a machine varies them
by image, not by a pin (docs/releases.md).

Where the installed packages already are the set's releases (a cluster image built for the set, or a pin of the
installed version) a run imports them as they are. Elsewhere the set is an overlay: its pinned distributions
installed by uv, without their dependencies, into a directory of its own under the cache
(`<cache>/software/<name>-<hash>`), built once and found again by the set and the interpreter; a run's child and its
fork server import with that directory first on their path (`apply`), so they import the pinned releases and the
installed packages for everything else. uv reads its own settings for where packages come from (`UV_INDEX_URL`,
`UV_FIND_LINKS` with `UV_OFFLINE=1` on a machine that reaches no index).

Planning prepares every set of a grid and checks it (`check`): each pin exists (uv's complaint, in a line), and the
set holds together with the installed packages, by pip's own check of every installed requirement over the overlay
and the installed packages (the problems that involve a pinned package: one line each). What an arm needs of a
release (a Liger kernel, a model type Liger patches) is read from that release's source (`liger_root`). A run checks
what it imported against its set (`check_imported`) and records the versions it imported.
"""

import functools
import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from finetune_bench.inputs.errors import SpecError
from finetune_bench.sources.cache import build_into, cache_root, slug

# The installed packages: what a run imports when its set pins nothing.
INSTALLED = ""
# The packages a set can pin: the project installs them and their code runs on any build of torch.
PINNABLE = (
    "liger-kernel",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "torchao",
    "cut-cross-entropy",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
)
# The packages that stay the image's, and why.
IMAGE_BOUND = ("torch", "triton", "bitsandbytes")
IMAGE_BOUND_PREFIXES = ("nvidia-", "cuda-")
_IMAGE_BOUND_WHY = (
    "its build is made for the GPU's driver and for torch's CUDA version, so it stays the image's: compare its "
    "releases with an image each (docs/releases.md)"
)
# A pin: a distribution name and an exact version.
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s,=]+)\s*$")
# The version of the code that builds an overlay (kept in its completion marker: a change builds it anew).
_BUILD_VERSION = "uv --target --no-deps, 1"
# What a run's child reads to find an overlay: Python's own search path.
PATH_ENV = "PYTHONPATH"


class SoftwareSetError(SpecError):
    """A software set that cannot be prepared or does not hold together; the message names the set and why."""


def parse(text: str, key: str = "training_args.software_set") -> dict[str, str]:
    """The set's pins, by canonical package name in name order (`{}` for the installed set); every problem of
    `text` in one SpecError naming `key`."""
    if not isinstance(text, str):
        raise SpecError(f"{key} must be a string of pins such as 'liger-kernel==0.8.2', got {text!r}")
    if not text.strip():
        return {}
    pins: dict[str, str] = {}
    problems = []
    for item in text.split(","):
        match = _PIN.match(item)
        if not match:
            problems.append(
                f"{key} {text!r}: {item.strip()!r} is not a pin; write package==version, e.g. 'liger-kernel==0.8.2' "
                "(pins joined by commas; '' is the installed packages)"
            )
            continue
        name, version = canonicalize_name(match.group(1)), match.group(2)
        if name in IMAGE_BOUND or name.startswith(IMAGE_BOUND_PREFIXES):
            problems.append(f"{key} {text!r}: {name} cannot be pinned in a set: {_IMAGE_BOUND_WHY}")
        elif name not in PINNABLE:
            problems.append(f"{key} {text!r}: {name} is not a package a set can pin; it can pin {', '.join(PINNABLE)}")
        try:
            Version(version)
        except InvalidVersion:
            problems.append(f"{key} {text!r}: {version!r} is not a version of {name} (PEP 440, e.g. 0.8.2)")
        if name in pins:
            problems.append(f"{key} {text!r}: pins {name} twice")
        pins[name] = version
    if problems:
        raise SpecError(*problems)
    return dict(sorted(pins.items()))


def canonical(text: str) -> str:
    """The set as one spelling (canonical names, name order, no spaces): two spellings of a set are one set."""
    return ",".join(f"{name}=={version}" for name, version in parse(text).items())


def check_syntax(key: str, value: object) -> None:
    """The setting's own rule: a set that parses (whether its releases exist is checked at planning: `check`)."""
    parse(value, key)  # type: ignore[arg-type]


def check_sweep(key: str, values: list) -> None:
    """A sweep whose every value is another set: two spellings of one set would train it twice."""
    seen: dict[str, str] = {}
    problems = []
    for value in values:
        try:
            same = canonical(value)
        except SpecError:  # refused on its own
            continue
        if same in seen:
            problems.append(f"{key}: {seen[same]!r} and {value!r} are the same set; keep one")
        seen.setdefault(same, value)
    if problems:
        raise SpecError(*problems)


def installed_version(name: str) -> str | None:
    """The version of `name` this process finds installed (None: not installed)."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _same(version: str | None, pinned: str) -> bool:
    return version is not None and Version(version) == Version(pinned)


@dataclass(frozen=True)
class PreparedSet:
    """A set ready to run: its pins, and its overlay (None when the installed packages are its releases)."""

    pins: dict[str, str] = field(default_factory=dict)
    overlay: Path | None = None


def overlay_dir(pins: dict[str, str]) -> Path:
    """Where the overlay of `pins` is kept: one per set and interpreter (its compiled modules' tags)."""
    name = ",".join(f"{n}=={v}" for n, v in pins.items())
    params = {"python": sys.implementation.cache_tag, "platform": sysconfig.get_platform()}
    return cache_root() / "software" / slug(name, params)


def _uv() -> str:
    """The uv executable: the one installed beside this interpreter (a dependency of the project), else on PATH."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else "uv"


def _install(pins: dict[str, str], target: Path) -> None:
    """Install the pinned distributions, without their dependencies, into `target` (uv's complaint in a line)."""
    command = [_uv(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(target)]
    try:
        done = subprocess.run(
            [*command, *(f"{n}=={v}" for n, v in pins.items())], capture_output=True, text=True, timeout=900
        )
    except FileNotFoundError:
        raise SoftwareSetError(
            "uv is not installed here (pip install uv): software sets are installed with it"
        ) from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        said = [line.removeprefix("cause:").strip() for line in lines if line.startswith(("cause:", "error:"))]
        why = " ".join(said[-1:] or lines[-1:]) or f"exit status {done.returncode}"
        raise SoftwareSetError(f"uv could not install {', '.join(f'{n}=={v}' for n, v in pins.items())}: {why}")


@functools.cache
def prepare(text: str) -> PreparedSet:
    """The set `text` ready to run: no overlay when the installed packages are its releases, else its overlay (built
    now with uv when it is not in the cache). Raises SoftwareSetError when a pin cannot be installed."""
    pins = parse(text)
    if all(_same(installed_version(name), version) for name, version in pins.items()):
        return PreparedSet(pins)
    dest = overlay_dir(pins)
    build_into(dest, lambda tmp: _install(pins, tmp), _BUILD_VERSION)
    return PreparedSet(pins, dest)


def apply(env: dict[str, str], text: str) -> None:
    """Put the set's overlay (if it has one) first on the search path of a child run with `env`."""
    prepared = prepare(text)
    if prepared.overlay is not None:
        env[PATH_ENV] = os.pathsep.join(p for p in (str(prepared.overlay), env.get(PATH_ENV, "")) if p)


def liger_root(text: str) -> str:
    """Where the set's liger-kernel is read from: its overlay when it pins a release the installed one is not, else
    "" (the installed one)."""
    prepared = prepare(text)
    return str(prepared.overlay) if prepared.overlay is not None and "liger-kernel" in prepared.pins else ""


_PIP_CHECK_LINE = re.compile(r"^(\S+) \S+ (?:has requirement|requires) ([A-Za-z0-9._-]+)")


@functools.cache
def conflicts(text: str) -> tuple[str, ...]:
    """What does not hold together once the set's overlay shadows the installed packages: pip's check of every
    requirement over both, the problems that involve a pinned package (one line each)."""
    prepared = prepare(text)
    if prepared.overlay is None:
        return ()
    env = dict(os.environ)
    apply(env, text)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    found = []
    for line in done.stdout.splitlines():
        match = _PIP_CHECK_LINE.match(line.strip())
        if match and {canonicalize_name(match.group(1)), canonicalize_name(match.group(2))} & set(prepared.pins):
            found.append(line.strip())
    if done.returncode != 0 and not done.stdout.strip():
        found.append(f"pip check could not run: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return tuple(found)


def check(text: str, key: str = "training_args.software_set") -> None:
    """The set can run here: every pin installed (or installable), and nothing it pins at odds with the installed
    packages. Every problem in one SoftwareSetError naming `key` and the set."""
    if not parse(text, key):
        return
    try:
        found = conflicts(text)
    except SoftwareSetError as exc:
        raise SoftwareSetError(f"{key} {text!r}: {exc}") from None
    if found:
        raise SoftwareSetError(
            *(f"{key} {text!r} does not hold together with the installed packages: {line}" for line in found)
        )


def check_imported(text: str) -> dict[str, str]:
    """Raise when this process finds another release of a pinned package than its set names (a run that would
    measure other software than it says); the versions it finds."""
    pins = parse(text)
    found = {name: installed_version(name) for name in pins}  # the first on this process's search path
    wrong = [
        f"{name}=={version} but finds {found[name] or 'none installed'}"
        for name, version in pins.items()
        if not _same(found[name], version)
    ]
    if wrong:
        raise RuntimeError(f"software set {text!r}: the run asks for {'; '.join(wrong)} (search path {sys.path[:3]})")
    return {name: str(version) for name, version in found.items()}
