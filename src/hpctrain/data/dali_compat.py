"""The DALI APIs that differ between the versions hpctrain supports (1.32 to the newest).

The NGC 23.12 image ships DALI 1.32.0 and installs hpctrain with --no-deps, so pip never checks
DALI's floor there; the pytorch-cuda image pins 1.53.0; the main CI pass runs 2.x. Everything that
moved between them is chosen here, by the running DALI's version, as train/compat.py does for torch.

| what | 1.32-1.43 | 1.44+ |
| --- | --- | --- |
| dynamic executor | no `exec_dynamic` keyword | `exec_dynamic=True` |

| what | 1.32 | 1.53+ |
| --- | --- | --- |
| `Pipeline.deserialize(graph, seed=...)` | the seed is ignored: the graph's own | the seed given |
| AutoGraph's `do_not_convert` | `nvidia.dali._autograph` only | `nvidia.dali.pipeline` (public) |
| a node's shape | `fn.shapes(node)` (no `DataNode.shape()`) | both; hpctrain uses `fn.shapes` |

`exec_dynamic`: DALI 1.32's `Pipeline` has no such keyword (read in the 1.32.0 wheel; passing it
fails in `_discriminate_args`: "This shouldn't happen. Please double-check the exec_dynamic
argument"); 1.39-1.43 call it `experimental_exec_dynamic` (not used here: those releases are stubs
on PyPI, so untested); the DALI 1.44.0 release notes: "The dynamic executor (exec_dynamic) is no
longer experimental" (#5704); it is the default from 1.51 (#5936).

`deserialize`'s seed: 1.32.0's `Pipeline.deserialize` hands the backend the batch size, threads,
device and executor from its keywords but no seed (read in the wheel), so every epoch's pipeline
deserialised from epoch 0's graph would draw epoch 0's crops, flips and RandAugment again. 1.53.0's
and 2.4.0's pass it (`_PipelineParams(seed=...)`, read in the wheels; NVIDIA/DALI#5866, "Pipeline
refactoring", April 2025). The first release with it is not read here, so below 1.53 (the oldest
tested DALI that has it) the loader traces each epoch's pipeline instead (slower, the same batches).

Imports no DALI at module level: the torch loader and the login node never need it.
"""

from __future__ import annotations

import re

MIN_DALI = (1, 32)  # pyproject.toml's floor: the NGC 23.12 image's DALI, tested by .ci/stack on its recipe
EXEC_DYNAMIC_MIN_DALI = (1, 44)  # `exec_dynamic` (before: absent, or experimental_exec_dynamic)
DESERIALIZE_SEED_MIN_DALI = (1, 53)  # Pipeline.deserialize(seed=...) honoured (1.32: ignored)


def version_tuple(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of `version` (default: the installed DALI): '1.32.0' → (1, 32)."""
    if version is None:
        import nvidia.dali  # DALI: optional (the torch loader and the login node run without it)

        version = nvidia.dali.__version__
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"cannot read a DALI version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def executor_args(version: str | None = None) -> dict:
    """The exec_* keywords for `Pipeline` and `Pipeline.deserialize`, named on every version:
    deserialize takes a missing exec_* as False (2.4: synchronous, unpipelined), the constructor as
    True. Pipelined and asynchronous everywhere; dynamic where this DALI has the keyword (1.44+).
    On 1.32-1.43 the older executor runs the same graph (CPU pipelines and the mixed decoder)."""
    args = dict(exec_pipelined=True, exec_async=True)
    if version_tuple(version) >= EXEC_DYNAMIC_MIN_DALI:
        args["exec_dynamic"] = True
    return args


def deserialize_takes_seed(version: str | None = None) -> bool:
    """Whether `Pipeline.deserialize(graph, seed=s)` draws from `s` (else from the graph's own seed)."""
    return version_tuple(version) >= DESERIALIZE_SEED_MIN_DALI


def do_not_convert(fn):
    """`fn` excluded from DALI's AutoGraph conversion (RandAugment's tables, docs/data.md).
    1.32 has the decorator only in the private `nvidia.dali._autograph` (read in the wheel); 1.53 and
    2.4 export it from `nvidia.dali.pipeline`."""
    try:
        from nvidia.dali.pipeline import do_not_convert as dnc  # DALI: optional
    except ImportError:  # DALI 1.32
        from nvidia.dali._autograph import do_not_convert as dnc  # DALI: optional
    return dnc(fn)
