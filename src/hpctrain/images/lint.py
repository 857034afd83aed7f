"""Lint an Apptainer definition file for the mistakes that cost a rebuild or leak a secret.

Rules: a `Bootstrap:` header with the source its agent needs (`From:` or `MirrorURL:`), only
known `%sections`, `%post` that stops on its first error (`set -e…` as its first command), no
tokens, passwords or private keys written into the file (they end up inside the image and in its
embedded definition), and a `%test` section so `apptainer test` checks the image.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from hpctrain.images import ImageError

SECTIONS = {
    "setup",
    "files",
    "environment",
    "post",
    "runscript",
    "startscript",
    "test",
    "labels",
    "help",
    "arguments",
    "appinstall",
    "apprun",
    "appenv",
    "appfiles",
    "applabels",
    "apptest",
    "apphelp",
    "appstart",
}
NEEDS_FROM = {"docker", "docker-daemon", "docker-archive", "library", "oras", "shub", "localimage"}
NEEDS_MIRROR = {"debootstrap", "yum", "zypper", "dnf", "busybox"}
AGENTS = NEEDS_FROM | NEEDS_MIRROR | {"scratch", "arch"}
SET_E = re.compile(r"^\s*set\s+(-[a-zA-Z]*e[a-zA-Z]*|-o\s+errexit)\b")
# (pattern, what it is)
SECRETS = [
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}"), "an NGC API key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"://[^/\s:@'\"]+:[^/\s@'\"$]+@"), "a password in a URL"),
    (
        re.compile(
            r"(?i)\b[A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY)[A-Z0-9_]*\s*[=:]\s*"
            r"['\"]?(?![$'\"{<])[^\s'\"]{6,}"
        ),
        "a secret assigned in the file",
    ),
]


@dataclass(frozen=True)
class Problem:
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: [{self.rule}] {self.message}" if self.line else f"[{self.rule}] {self.message}"


def lint_text(text: str) -> list[Problem]:
    """All problems found in the definition `text` (empty list: clean). Multi-stage files are
    checked stage by stage; only the final stage needs %test."""
    problems: list[Problem] = []
    stages: list[tuple[dict, dict]] = [({}, {})]  # (header key → (line, value), section → (line, body))
    current: list[tuple[int, str]] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        for pattern, what in SECRETS:
            if pattern.search(raw):
                problems.append(
                    Problem(
                        n,
                        "secret",
                        f"{what} is written into the recipe (it would be baked into "
                        "the image and its embedded definition); pass it at build time "
                        "instead (e.g. `--build-arg`/environment, or a bind-mounted file)",
                    )
                )
                break
        if re.match(r"(?i)^bootstrap\s*:", raw) and current is not None:
            stages.append(({}, {}))
            current = None
        header, sections = stages[-1]
        m = re.match(r"^%(\w+)", line)
        if m and not raw[:1].isspace():
            name = m.group(1).lower()
            if name not in SECTIONS:
                near = difflib.get_close_matches(name, sorted(SECTIONS), 1)
                hint = f"; did you mean %{near[0]}?" if near else ""
                problems.append(Problem(n, "section", f"unknown section %{m.group(1)}{hint}"))
            current = []
            sections.setdefault(name, (n, current))
            continue
        if current is not None:
            current.append((n, raw))
        elif line and not line.startswith("#"):
            key, sep, value = line.partition(":")
            if sep:
                header[key.strip().lower()] = (n, value.strip())
    for i, (header, sections) in enumerate(stages):
        problems += _check_stage(header, sections, final=i == len(stages) - 1)
    return sorted(problems, key=lambda p: p.line)


def _check_stage(header: dict, sections: dict, final: bool) -> list[Problem]:
    problems: list[Problem] = []
    if "bootstrap" not in header:
        problems.append(
            Problem(
                1,
                "bootstrap",
                "no `Bootstrap:` header; start the file with e.g. `Bootstrap: docker` and `From: <image>`",
            )
        )
    else:
        n, agent = header["bootstrap"]
        agent = agent.lower()
        if agent not in AGENTS:
            problems.append(
                Problem(
                    n,
                    "bootstrap",
                    f"unknown bootstrap agent {agent!r}; use one of " + ", ".join(sorted(AGENTS)),
                )
            )
        elif agent in NEEDS_FROM and not header.get("from", (0, ""))[1]:
            problems.append(Problem(n, "source", f"`Bootstrap: {agent}` needs a `From:` line naming the image"))
        elif agent in NEEDS_MIRROR and not header.get("mirrorurl", (0, ""))[1]:
            problems.append(Problem(n, "source", f"`Bootstrap: {agent}` needs a `MirrorURL:` line"))
    if "post" in sections:
        n, body = sections["post"]
        first = next(((ln, s) for ln, s in body if s.strip() and not s.strip().startswith("#")), None)
        if first is not None and not SET_E.match(first[1]):
            problems.append(
                Problem(
                    first[0],
                    "post-errexit",
                    "%post does not stop on its first error: make "
                    "`set -eu` its first command (a failed step would otherwise be "
                    "ignored and the image built anyway)",
                )
            )
    if final and "test" not in sections:
        problems.append(
            Problem(
                0,
                "test",
                "no %test section: add one that imports torch/DALI and checks "
                "CUDA, NCCL and the verbs provider, so `apptainer test --nv` catches a "
                "broken image",
            )
        )
    return problems


def lint_file(path: str | Path) -> list[Problem]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ImageError(f"cannot read recipe {path}: {e.strerror}") from None
    return lint_text(text)
