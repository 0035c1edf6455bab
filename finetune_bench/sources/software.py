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
set holds together with the installed packages: every requirement of every distribution a run finds (the overlay's
first, then the installed ones) against the version it finds, as `pip check` does (an image need not have pip), the
problems that involve a pinned package, one line each. What an arm needs of a
release (a Liger kernel, a model type Liger patches) is read from that release's source (`liger_root`). A run checks
what it imported against its set (`check_imported`) and records the versions it imported.
"""

import dataclasses
import functools
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import model_type
from finetune_bench.inputs.errors import ConditionRefused, Problems, SpecError
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.software_sets import INSTALLED, parse
from finetune_bench.sources.cache import build_into, cache_root, slug


class SoftwareSetError(SpecError):
    """A software set that cannot be prepared or does not hold together; the message names the set and why."""


# The version of the code that builds an overlay (kept in its completion marker: a change builds it anew).
_BUILD_VERSION = "uv --target --no-deps, 1"
# What a run's child reads to find an overlay: Python's own search path.
PATH_ENV = "PYTHONPATH"


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


# What installing a set here needs, said when it fails.
UV_NEEDS = (
    "uv installs a set's pins from the package index, so this machine must reach it: directly, through HTTPS_PROXY, "
    "or through a mirror named by UV_INDEX_URL / UV_DEFAULT_INDEX (UV_FIND_LINKS with UV_OFFLINE=1 for local "
    "wheels); behind a proxy that re-signs TLS, UV_NATIVE_TLS=1 or SSL_CERT_FILE naming its certificate. On a cluster, "
    "registering with the inputs file that names the set gives it an image of its own instead (docs/releases.md)"
)


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
        raise SoftwareSetError(
            f"uv could not install {', '.join(f'{n}=={v}' for n, v in pins.items())}: {why} ({UV_NEEDS})"
        )


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


def _seen_first(overlay: Path) -> dict[str, md.Distribution]:
    """Every distribution a run of the overlay finds, by canonical name: the first on its search path (the overlay's,
    then the installed ones), as its imports do."""
    found: dict[str, md.Distribution] = {}
    for distribution in md.distributions(path=[str(overlay), *sys.path]):
        name = canonicalize_name(distribution.metadata["Name"] or "")
        if name:
            found.setdefault(name, distribution)
    return found


@functools.cache
def conflicts(text: str) -> tuple[str, ...]:
    """What does not hold together once the set's overlay shadows the installed packages: every requirement of every
    distribution a run finds, checked against the version it finds (as `pip check` does, where an image need not
    have pip), the problems that involve a pinned package, one line each."""
    prepared = prepare(text)
    if prepared.overlay is None:
        return ()
    seen = _seen_first(prepared.overlay)
    found = []
    for name, distribution in seen.items():
        for written in distribution.requires or []:
            try:
                requirement = Requirement(written)
            except InvalidRequirement:  # metadata no installer would have read either
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue  # an extra's, or another platform's
            needed = canonicalize_name(requirement.name)
            if not {name, needed} & set(prepared.pins):
                continue
            who = f"{name} {distribution.version}"
            have = seen.get(needed)
            if have is None:
                found.append(f"{who} requires {requirement}, which is not installed.")
            elif not requirement.specifier.contains(have.version, prereleases=True):
                found.append(f"{who} has requirement {requirement}, but you have {needed} {have.version}.")
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


def check_all(texts: list[str], key: str, imaged: Collection[str] = ()) -> None:
    """Each set of `texts` can run here (`check`), every problem of every set in one SpecError naming `key`; a set
    whose spelling is refused is left to the settings' own check, a set of `imaged` (its runs train on an image built
    for it: `checked_runs`) to its image's build."""
    problems = Problems()
    for text in dict.fromkeys(texts):
        try:
            parse(text)
        except SpecError:
            continue
        if text in imaged:
            continue
        with problems.check():
            check(text, key)
    with problems.check():
        _check_not_the_installed_set_again(list(dict.fromkeys(texts)), key)
    problems.raise_if_any()


def _check_not_the_installed_set_again(texts: list[str], key: str) -> None:
    """Beside the installed set (''), a set whose every pin is the release installed here is the installed set again:
    the grid would compare a release with itself."""
    if INSTALLED not in texts:
        return
    for text in texts:
        try:
            pins = parse(text)
        except SpecError:
            continue
        if pins and all(_same(installed_version(name), version) for name, version in pins.items()):
            installed = ", ".join(f"{name} {version}" for name, version in pins.items())
            raise SpecError(
                f"{key} {text!r} pins the releases installed here ({installed}), so beside '' (the installed "
                "packages) it compares a release with itself; pin another release, or leave one of the two out"
            )


def checked_runs(runs: list[PlannedRun], swept: bool, imaged: Collection[str] = ()) -> list[PlannedRun]:
    """`runs` (planned) once every software set among them is ready here: each set installed and holding together
    with the installed packages, every problem of every set in one SpecError (`swept`: the set is an axis, and the
    messages name `experiment_args`); a run whose set's liger-kernel lacks what its arm needs (a kernel, a model
    type) is refused with why.

    `imaged`: the sets whose runs train on an image of their own (a cluster's, built at registration with the set's
    pins in place of the lockfile's, so its installer resolved them with the other packages). Nothing of such a set
    is installed here: what its liger-kernel has is checked where its runs train (`with_release_checked`)."""
    key = f"{'experiment_args' if swept else 'training_args'}.software_set"
    check_all([run.training_args.software_set for run in runs], key, imaged)
    problems = Problems()
    for run in runs:
        if not run.refused and run.training_args.software_set not in imaged:
            with problems.check():
                try:
                    _check_release_has_what_the_arm_needs(run)
                except ConditionRefused as refusal:
                    run.refused = str(refusal)
    problems.raise_if_any()
    return runs


def with_release_checked(run: PlannedRun) -> PlannedRun:
    """`run`, refused with why when its set pins a liger-kernel that, as this process finds it installed, lacks what
    its arm needs: where the set's runs train on an image of the set's own, the check planning leaves to that image
    (`checked_runs`' `imaged`)."""
    pins = parse(run.training_args.software_set)
    if run.refused or "liger-kernel" not in pins or not _same(installed_version("liger-kernel"), pins["liger-kernel"]):
        return run
    try:
        _check_release_has_what_the_arm_needs(run, root="")
    except (ConditionRefused, SpecError) as refusal:
        return dataclasses.replace(run, refused=str(refusal))
    return run


def _check_release_has_what_the_arm_needs(run: PlannedRun, root: str | None = None) -> None:
    """Liger's kernels and model types as the set's own release has them (read from its source: its overlay's, or
    with `root` "" the installed one), for a run whose set pins liger-kernel."""
    from finetune_bench.inputs.arms import kernel_switches, supported_model_types

    t, arm = run.training_args, parse_arm(run.training_args.arm)
    if root is None:
        root = liger_root(t.software_set)
        if not root:
            return
    if not arm.liger:
        return
    liger = f"liger-kernel {parse(t.software_set)['liger-kernel']}"
    where = f" (condition {run.condition_id})"
    try:
        supported = supported_model_types(root)
    except Exception as exc:  # a release older than the shape of Liger's table this project reads
        raise SpecError(
            f"arm {arm.name!r}{where}: {liger}'s table of patch functions cannot be read ({type(exc).__name__}: "
            f"{exc}); pin liger-kernel 0.2.0 or newer"
        ) from None
    kind = model_type(t.model_name)
    if kind is None:
        return
    if kind not in supported:
        raise ConditionRefused(
            f"arm {arm.name!r}: {liger} has no kernels for model type {kind!r}{where}; it patches {supported}"
        )
    missing = [k for k in arm.liger_kernels if k not in kernel_switches(kind, root)]
    if missing:
        raise ConditionRefused(
            f"arm {arm.name!r}: {liger} has no {' / '.join(map(repr, missing))} kernel for model type {kind!r}"
            f"{where}; it has {list(kernel_switches(kind, root))}"
        )
