"""The version follows what users depend on: a config key added, removed or renamed changes
`hpctrain.__version__`, and CHANGELOG.md has a section for every version (CONTRIBUTING.md).

tests/changelog_lock.json holds the version and the config keys it was released with; after a
bump, `python -m tests.test_changelog --write` rewrites it."""

from __future__ import annotations

import json
import re
import sys

from hpctrain import __version__, config
from tests.helpers import ROOT

LOCK = ROOT / "tests" / "changelog_lock.json"


def config_keys() -> list[str]:
    return sorted(key for key, _default, _doc in config.describe())


def test_config_keys_change_only_with_the_version():
    lock = json.loads(LOCK.read_text())
    added = sorted(set(config_keys()) - set(lock["config_keys"]))
    removed = sorted(set(lock["config_keys"]) - set(config_keys()))
    if added or removed:
        assert __version__ != lock["version"], (
            f"config keys changed (added {added}, removed {removed}) under the same version {__version__}: "
            "bump hpctrain.__version__, add its CHANGELOG.md section, then `python -m tests.test_changelog --write`"
        )


def test_changelog_has_a_section_for_this_version():
    headings = re.findall(r"^## \[?([0-9][^\]\s]*)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert __version__ in headings, f"CHANGELOG.md has no '## {__version__}' section (has {headings})"


def test_the_wheel_the_docs_install_is_this_versions():
    """README's and docs' `pip install dist/hpctrain-X.Y.Z-…whl` lines name the wheel `pip wheel` builds
    now: a bump without them sends the reader to a file that is not there."""
    stale = [
        f"{page.name}: {name}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for name in re.findall(r"hpctrain-(\d+\.\d+\.\d+)-py3", page.read_text())
        if name != __version__
    ]
    assert not stale, f"wheel names of another version than {__version__}: {stale}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    LOCK.write_text(json.dumps({"version": __version__, "config_keys": config_keys()}, indent=1) + "\n")
