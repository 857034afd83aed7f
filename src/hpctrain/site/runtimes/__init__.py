"""The container runtimes, one module each (apptainer, singularity, pyxis, none), and the registry
that everything runtime-specific reads: the profile's `container.runtime` choices, `cluster init`,
`doctor`, the notebook and the batch shell's renderers (docs/runtimes.md, "Adding a runtime").

Detection (for `doctor` and `cluster init`): each runtime's `detect` asks the node (docs/launch.md,
"Container runtimes", has the sources); a runtime can also come from a module (`module load
apptainer/1.3.4`): the module is loaded in a throw-away shell and the same command asked. No torch:
this runs on login nodes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from hpctrain.config import ConfigError
from hpctrain.site.runtimes import apptainer, none, pyxis, singularity
from hpctrain.site.runtimes.base import Found, Runtime

# by name, in the order cluster init prefers them; a view of it is container.runtime's choices
REGISTRY: dict[str, Runtime] = {m.RUNTIME.name: m.RUNTIME for m in (apptainer, singularity, pyxis, none)}
CHOICES = REGISTRY.keys()  # live: a runtime registered later is a choice too


def get(name: str) -> Runtime:
    """The runtime called `name` (ConfigError naming the ones there are)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"container runtime {name!r} is not one of {', '.join(REGISTRY)}") from None


@contextmanager
def registered(runtime: Runtime) -> Iterator[Runtime]:
    """`runtime` in the registry inside the block (a plugin's or a test's), before `none`."""
    if runtime.name in REGISTRY:
        raise ConfigError(f"container runtime {runtime.name!r} is registered already")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", runtime.name):  # it names a bash function of the batch script
        raise ConfigError(f"container runtime {runtime.name!r}: use lower-case letters, digits and _")
    before = dict(REGISTRY)
    REGISTRY.clear()
    REGISTRY.update({k: v for k, v in before.items() if k != "none"} | {runtime.name: runtime, "none": before["none"]})
    try:
        yield runtime
    finally:
        REGISTRY.clear()
        REGISTRY.update(before)


def image_runtimes() -> list[Runtime]:
    """The runtimes that start an image (all but none), in the registry's order."""
    return [r for r in REGISTRY.values() if r.image_kind]


def detect(module_init: str = "", modules: Sequence[str] = ()) -> list[Found]:
    """Every runtime here, each once, in the registry's order: on PATH first, then from the given
    modules (e.g. the newest `apptainer` and `singularity`, loaded with `module_init`, Lmod's init script)."""
    found: dict[str, Found] = {}
    for r in image_runtimes():
        f = r.detect()
        if f:
            found[r.name] = f
    if module_init:
        for m in modules:
            prefix = f". {shlex.quote(module_init)} && module load {shlex.quote(m)}"
            for r in image_runtimes():
                if r.name not in found and r.module_stem and (f := r.detect(prefix, m)):
                    found[r.name] = f
    return [found[name] for name in REGISTRY if name in found]


def image_kind(image: str) -> str:
    """Which runtimes can run `image`: the kind of the first runtime that claims it by its name
    ("enroot" for a .sqsh or a registry URI: pyxis), else "sif" (a path with no known ending is taken
    for a SIF, Apptainer's and SingularityCE's)."""
    return next((r.image_kind for r in image_runtimes() if r.claims(image)), "sif")


def choose(found: list[Found], image: str) -> tuple[str, Found | None]:
    """The runtime for `image` (a path or URI; "" when none was given): the first found that runs
    it; for an image nothing found runs: the first runtime of its kind (to review). No image: none."""
    if not image:
        return "none", None
    want = [r.name for r in image_runtimes() if r.image_kind == image_kind(image)]
    for f in found:
        if f.runtime in want:
            return f.runtime, f
    return want[0], None
