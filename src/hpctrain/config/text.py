"""Checks of one text value, which the sections' rules and the rest of the package share: a window of
steps (`"A-B"`), a run path that sbatch and submitit would not rewrite (no `%`, no `\\`), and no
control character in a value that reaches a batch-script line or a file name."""

from __future__ import annotations

import re
import unicodedata

from hpctrain.config.field import ConfigError

STEP_WINDOW_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def step_window(text: str, key: str) -> tuple[int, int] | None:
    """`"A-B"` → (A, B), global optimizer steps 1 <= A <= B, inclusive; "" → None (off)."""
    if not str(text).strip():
        return None
    m = STEP_WINDOW_RE.match(str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(
            f"{key}={text!r} is not a step window: use A-B with 1 <= A <= B (global steps, "
            "inclusive), e.g. 20-25, or leave it empty to turn it off"
        )
    return int(m.group(1)), int(m.group(2))


# sbatch(1), "filename pattern": in --output/--error paths `%` starts a replacement (%j, %t, %A, %a, %x,
# %4j...) and a backslash turns the replacements off; submitit 1.5.4 (core/utils.py, JobPaths) replaces
# %j, %t, %A, %a in its folder. The run directory holds the submitit folder and the logs sbatch names.
PATTERN_CHARS = {"%": "starts a file-name pattern (%j becomes the job id)", "\\": "turns the patterns off"}


def check_pattern_free(key: str, value: str) -> None:
    """Refuse a run path that sbatch or submitit would rewrite: the job's logs and its pickle would
    land in a directory that does not exist (sbatch's `%j`) or be named alike for every job (`\\`)."""
    for ch, why in PATTERN_CHARS.items():
        if ch in value:
            fix = value.replace(ch, "_")
            raise ConfigError(
                f"{key}={value!r}: {ch!r} {why} in the paths sbatch and submitit write (sbatch(1), "
                f"filename pattern), so the job's logs and pickle would not be where hpctrain looks; "
                f"choose one without it, e.g. {key}={fix!r}"
            )


def control_char(text: str) -> str | None:
    """The first control character (Unicode category Cc) in `text`, escaped as Python writes it
    (`\\n`, `\\x1b`), or None."""
    for ch in text:
        if unicodedata.category(ch) == "Cc":
            return repr(ch)[1:-1]
    return None


def check_text(text: str, key: str) -> None:
    """Refuse control characters: values reach batch-script lines, `#SBATCH` options, comments and
    file names, where a newline ends the line (the rest runs as a command on the compute node)
    and the others garble or hide what is written."""
    ch = control_char(text)
    if ch:
        raise ConfigError(
            f"{key}: contains a control character ({ch}); remove it: values reach the "
            "batch script and file names, where it would break the line"
        )
