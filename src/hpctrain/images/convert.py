"""Dockerfile → Apptainer definition: spython parses, this module fixes what it gets wrong.

spython 0.3.14 (tests/images/test_image_convert.py) merges an unnamed final `FROM` into the previous stage, writes
`LABEL a=1 b=2` as one label line, copies `ENV` into `%post` without `export`, turns `USER` into
`su - user` inside `%post`, makes `HEALTHCHECK` a `%test` and runs `CMD` through `/bin/bash`.
So the Dockerfile is pre-processed (stages named, labels taken out, instructions Apptainer has no
use for dropped with a note, ones whose meaning would change refused), spython parses the rest,
and the definition is written here from spython's per-stage recipes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from spython.main.parse.parsers import DockerParser

from hpctrain.images import ImageError

DROPPED = {
    "HEALTHCHECK": "Apptainer has no health checks (a service probe is not a build-time %test)",
    "EXPOSE": "Apptainer containers share the host network; there are no ports to expose",
    "VOLUME": "Apptainer binds host paths at run time (--bind)",
    "STOPSIGNAL": "Apptainer has no stop signal setting",
}
REFUSED = {
    "SHELL": "SHELL changes how every later RUN is interpreted; rewrite those RUN lines for /bin/sh",
    "ONBUILD": "ONBUILD triggers have no Apptainer equivalent; put the steps in the derived recipe",
}


@dataclass
class Conversion:
    definition: str
    notes: list[str] = field(default_factory=list)


@dataclass
class _Instr:
    line: int
    keyword: str
    args: str


def _instructions(text: str) -> list[_Instr]:
    """Logical instructions: comments dropped, `\\` continuations joined."""
    out: list[_Instr] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1].rstrip() + " "
            continue
        buf += s
        keyword, _, args = buf.partition(" ")
        if "<<" in buf and re.search(r"<<-?\s*['\"]?\w+['\"]?\s*$", buf) and keyword.upper() in ("RUN", "COPY"):
            raise ImageError(
                f"line {start}: heredoc `{keyword} <<…` is not supported by the converter; "
                "put the script in a file and RUN it, or write the %post section by hand"
            )
        out.append(_Instr(start, keyword.upper(), args.strip()))
        buf = ""
    if buf:
        raise ImageError(f"line {start}: the file ends inside a `\\` continuation")
    return out


def _label_pairs(args: str, line: int) -> list[tuple[str, str]]:
    try:
        words = shlex.split(args)
    except ValueError as e:
        raise ImageError(f"line {line}: cannot parse LABEL ({e})") from None
    pairs = []
    for i, w in enumerate(words):
        if "=" not in w:
            if i == 0 and len(words) == 2:  # legacy `LABEL key value`
                return [(words[0], words[1])]
            raise ImageError(f"line {line}: LABEL item {w!r} is not key=value")
        k, _, v = w.partition("=")
        pairs.append((k, v))
    return pairs


def _prepare(instrs: list[_Instr], notes: list[str]) -> tuple[list[str], dict[str, list[tuple[str, str]]], list[str]]:
    """Fixed lines for spython, labels per stage, stage names in order."""
    froms = [i for i, ins in enumerate(instrs) if ins.keyword == "FROM"]
    if (
        not froms
        or instrs[froms[0]].keyword != "FROM"
        or froms[0] != next((i for i, ins in enumerate(instrs) if ins.keyword not in ("ARG",)), froms[0])
    ):
        raise ImageError("the Dockerfile must start with FROM (ARG lines may come before it)")
    multi = len(froms) > 1
    names: list[str] = []
    rename: dict[str, str] = {}
    for si, i in enumerate(froms):
        words = [w for w in instrs[i].args.split() if not w.startswith("--platform")]
        if len(words) != len(instrs[i].args.split()):
            notes.append(f"line {instrs[i].line}: dropped FROM --platform (Apptainer builds for this host)")
        if len(words) == 3 and words[1].upper() == "AS":
            name = words[2]
        elif len(words) == 1:
            name = "final" if si == len(froms) - 1 else f"stage{si}"
            if multi:
                while name in names:
                    name += "_"
                what = "final stage" if si == len(froms) - 1 else f"stage {si}"
                notes.append(
                    f"line {instrs[i].line}: named the unnamed {what} {name!r} "
                    "(spython would merge it into the previous stage)"
                )
            rename[str(si)] = name
        else:
            raise ImageError(f"line {instrs[i].line}: cannot parse `FROM {instrs[i].args}`")
        names.append(name)
        instrs[i].args = f"{words[0]} AS {name}" if multi else words[0]

    lines: list[str] = []
    labels: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
    stage = -1
    for idx, ins in enumerate(instrs):
        k = ins.keyword
        if k == "FROM":
            stage += 1
        name = names[max(stage, 0)]
        if k in REFUSED:
            raise ImageError(f"line {ins.line}: cannot convert {k}: {REFUSED[k]}")
        if k in DROPPED:
            notes.append(f"line {ins.line}: dropped {k} {ins.args}: {DROPPED[k]}")
            continue
        if k == "USER":
            later = [j for j in instrs[idx + 1 :] if j.keyword in ("FROM", "RUN")]
            if later and later[0].keyword == "RUN":
                raise ImageError(
                    f"line {ins.line}: cannot convert `USER {ins.args}` followed by RUN "
                    f"(line {later[0].line}): "
                    "Apptainer's %post runs as root, so those steps would run as a different user; move them "
                    f"before USER, or run them with `su {ins.args.split(':')[0]} -c '…'`"
                )
            notes.append(
                f"line {ins.line}: dropped USER {ins.args}: an Apptainer container runs as the user who starts it"
            )
            continue
        if k in ("LABEL", "MAINTAINER"):
            pairs = [("maintainer", ins.args)] if k == "MAINTAINER" else _label_pairs(ins.args, ins.line)
            if len(pairs) > 1:
                notes.append(f"line {ins.line}: split LABEL with {len(pairs)} pairs into {len(pairs)} labels")
            labels[name] += pairs
            continue
        if k in ("COPY", "ADD"):
            words = ins.args.split()
            flags = [w for w in words if w.startswith("--") and not w.startswith("--from")]
            if flags:
                notes.append(f"line {ins.line}: dropped {k} {' '.join(flags)} (files are owned by root in %files)")
            words = [w for w in words if w not in flags]
            for i, w in enumerate(words):
                if w.startswith("--from="):
                    src = w.split("=", 1)[1]
                    if src in rename:
                        words[i] = f"--from={rename[src]}"
                    elif src not in names:
                        raise ImageError(
                            f"line {ins.line}: `{k} --from={src}` copies from an image, not a "
                            "stage of this file; add `FROM {src} AS <name>` as a stage"
                        )
            ins.args = " ".join(words)
        lines.append(f"{k} {ins.args}")
    return lines, labels, names


def _spython_recipes(lines: list[str]) -> dict:
    class Parser(DockerParser):
        def _env(self, line):  # ENV applies to later RUN steps: export it there, not a bare assignment
            environ = self.parse_env(self._setup("ENV", line))
            self.recipe[self.active_layer].install += [f"export {e}" for e in environ]
            self.recipe[self.active_layer].environ += environ

    p = Parser(filename=None, load=False)
    p.lines = lines
    p.parse()
    return p.recipe


def _section(name: str, body: list[str]) -> list[str]:
    return [f"%{name}", *("    " + b for b in body), ""] if body else []


def convert_text(text: str) -> Conversion:
    """Convert Dockerfile `text`; raises ImageError for what cannot be converted faithfully."""
    notes: list[str] = []
    lines, labels, names = _prepare(_instructions(text), notes)
    recipes = _spython_recipes(lines)
    if len(names) > 1 and list(recipes) != names:
        raise ImageError(f"spython found stages {list(recipes)}, expected {names}")
    out: list[str] = []
    for si, (stage, r) in enumerate(recipes.items()):
        final = si == len(recipes) - 1
        out += ["Bootstrap: docker", f"From: {r.fromHeader.strip()}"]
        out += [f"Stage: {stage}", ""] if len(recipes) > 1 else [""]
        out += _section("files", [" ".join(f) for f in r.files])
        for layer, files in r.layer_files.items():
            out += [f"%files from {layer}", *("    " + " ".join(f) for f in files), ""]
        stage_labels = labels[names[si]] if len(names) > 1 else next(iter(labels.values()))
        out += _section("labels", [f"{k} {v}" for k, v in stage_labels])
        out += _section("environment", [f"export {e}" for e in r.environ])
        if r.install:
            out += _section("post", ["set -e", *(ln.rstrip() for ln in r.install)])
        if final:
            entry = r.entrypoint if isinstance(r.entrypoint, list) else shlex.split(r.entrypoint or "")
            cmd = r.cmd if isinstance(r.cmd, list) else shlex.split(r.cmd or "")
            body = [f"cd {shlex.quote(r.workdir)}"] if r.workdir else []
            if cmd and entry:
                body += [f'[ "$#" -gt 0 ] || set -- {shlex.join(cmd)}', f'exec {shlex.join(entry)} "$@"']
            elif entry:
                body += [f'exec {shlex.join(entry)} "$@"']
            elif cmd:
                body += [f'[ "$#" -gt 0 ] || set -- {shlex.join(cmd)}', 'exec "$@"']
            out += _section("runscript", body)
    if "%test" not in out:
        notes.append("no %test section: add one that checks the image (`hpctrain image lint` asks for it)")
    return Conversion("\n".join(out).rstrip() + "\n", notes)


def convert_file(path: str | Path) -> Conversion:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ImageError(f"cannot read {path}: {e.strerror}") from None
    return convert_text(text)
