"""Dockerfile → definition: the cases spython gets wrong are fixed or refused with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from hpctrain.images import ImageError
from hpctrain.images.convert import convert_text
from hpctrain.images.lint import lint_text

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def sections(definition: str) -> dict[str, list[str]]:
    """Stage-less view: section header → its stripped body lines (first occurrence per stage wins)."""
    out: dict[str, list[str]] = {}
    cur = None
    for ln in definition.splitlines():
        if ln.startswith("%"):
            cur = out.setdefault(ln, [])
        elif cur is not None and ln.strip():
            cur.append(ln.strip())
        elif not ln.strip():
            cur = None
    return out


def test_simple_dockerfile():
    conv = convert_text("""FROM python:3.11-slim
ENV APP_HOME=/app PYTHONUNBUFFERED=1
COPY requirements.txt /app/
RUN pip install -r /app/requirements.txt
WORKDIR /app
ENTRYPOINT ["python", "-m", "http.server"]
CMD ["8000"]
""")
    d = conv.definition
    assert d.startswith("Bootstrap: docker\nFrom: python:3.11-slim\n")
    s = sections(d)
    assert s["%files"] == ["requirements.txt /app/"]
    assert s["%environment"] == ["export APP_HOME=/app", "export PYTHONUNBUFFERED=1"]
    # ENV is exported for the later RUN steps, and %post stops on the first error
    assert s["%post"][:3] == ["set -e", "export APP_HOME=/app", "export PYTHONUNBUFFERED=1"]
    assert s["%runscript"] == ["cd /app", '[ "$#" -gt 0 ] || set -- 8000', 'exec python -m http.server "$@"']
    assert "Stage:" not in d
    assert [p.rule for p in lint_text(d)] == ["test"]
    (stage,) = SingularityParser_from_text(d).values()
    assert stage.fromHeader.strip() == "python:3.11-slim"


def SingularityParser_from_text(text: str) -> dict:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".def", delete=False) as f:
        f.write(text)
    return SingularityParser(f.name).recipe


def test_named_multistage():
    d = convert_text("""FROM golang:1.22 AS build
RUN go build -o /out/app ./cmd/app
FROM debian:12-slim AS runtime
COPY --from=build /out/app /usr/local/bin/app
CMD ["app"]
""").definition
    stages = d.split("\n\nBootstrap:")
    assert len(stages) == 2
    assert "From: golang:1.22\nStage: build" in stages[0] and "go build -o /out/app ./cmd/app" in stages[0]
    assert "%runscript" not in stages[0]
    assert "From: debian:12-slim\nStage: runtime" in stages[1]
    assert "%files from build\n    /out/app /usr/local/bin/app" in stages[1]
    assert '[ "$#" -gt 0 ] || set -- app\n    exec "$@"' in stages[1]


def test_unnamed_multistage_gets_stage_names():
    conv = convert_text("""FROM golang:1.22
RUN go build -o /app .
FROM debian:12
COPY --from=0 /app /usr/bin/app
CMD ["app"]
""")
    d = conv.definition
    # spython alone merges the second FROM into the first stage; here both survive
    assert "From: golang:1.22\nStage: stage0" in d and "From: debian:12\nStage: final" in d
    assert "%files from stage0\n    /app /usr/bin/app" in d
    assert any("named the unnamed final stage 'final'" in n for n in conv.notes)


def test_multi_pair_label_split():
    conv = convert_text(
        'FROM alpine:3.19\nLABEL org.opencontainers.image.title="my image" version=1.2 '
        "maintainer=me@example.org\nRUN apk add curl\n"
    )
    assert sections(conv.definition)["%labels"] == [
        "org.opencontainers.image.title my image",
        "version 1.2",
        "maintainer me@example.org",
    ]
    assert "line 2: split LABEL with 3 pairs into 3 labels" in conv.notes


def test_user_healthcheck_dropped_with_notes():
    conv = convert_text(
        "FROM nginx:1.25\nRUN echo hi\nEXPOSE 80\nUSER nginx\nHEALTHCHECK CMD curl -f http://localhost/\n"
    )
    d = conv.definition
    assert "su -" not in d and "USER" not in d and "%test" not in d and "curl" not in d
    notes = " ".join(conv.notes)
    assert "dropped USER nginx" in notes and "dropped HEALTHCHECK" in notes and "dropped EXPOSE 80" in notes


def test_user_before_run_is_refused():
    with pytest.raises(ImageError, match=r"line 2: cannot convert `USER app` followed by RUN \(line 3\)"):
        convert_text("FROM debian:12\nUSER app\nRUN pip install --user x\n")


def test_shell_refused():
    with pytest.raises(ImageError, match="cannot convert SHELL"):
        convert_text('FROM debian:12\nSHELL ["/bin/bash", "-c"]\nRUN echo hi\n')


def test_site_dockerfile_converts(tmp_path):
    out = tmp_path / "site.def"
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", "image", "convert", str(RECIPES / "Dockerfile"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    s = sections(out.read_text())
    assert "From: nvcr.io/nvidia/pytorch:23.12-py3" in out.read_text()
    assert s["%labels"] == [
        "org.opencontainers.image.title site-hpctrain",
        "hpctrain.base nvcr.io/nvidia/pytorch:23.12-py3",
    ]
    assert s["%runscript"] == ['exec hpctrain "$@"']
    assert "split LABEL with 2 pairs" in r.stderr


def test_convert_o_refuses_an_existing_file_unless_force(tmp_path):
    """As `sbatch-template` does: an existing definition is never overwritten unasked."""
    out = tmp_path / "site.def"
    out.write_text("my edited definition\n")
    argv = [sys.executable, "-m", "hpctrain", "image", "convert", str(RECIPES / "Dockerfile"), "-o", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == f"hpctrain: error: {out} already exists: pass --force to overwrite it, or give another path\n"
    assert out.read_text() == "my edited definition\n"
    r = subprocess.run([*argv, "--force"], capture_output=True, text=True)
    assert r.returncode == 0 and "From: nvcr.io/nvidia/pytorch:23.12-py3" in out.read_text(), r.stderr
