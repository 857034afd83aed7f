"""What the package ships and the CLI serves by name from anywhere: run configs, cluster profiles,
Apptainer recipes and the stand-alone batch script.

They live inside the package (so the wheel carries them); the checkout's top-level `configs/`,
`recipes/` and `slurm/` are symbolic links to these folders: one copy, nothing to keep in sync.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import UserError

PACKAGE = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE / "configs"
CLUSTER_DIR = CONFIG_DIR / "clusters"
RECIPE_DIR = PACKAGE / "recipes"
SBATCH_TEMPLATE = PACKAGE / "slurm" / "vit.sbatch"


class NotShipped(UserError):
    """A name that is neither a file nor something the package ships."""


def configs() -> list[Path]:
    """Shipped run configs, by name."""
    return sorted(CONFIG_DIR.glob("*.yaml"))


def profiles() -> list[Path]:
    """Shipped cluster profiles, by name."""
    return sorted(CLUSTER_DIR.glob("*.yaml"))


def recipes() -> list[Path]:
    """Shipped Apptainer definitions and the Dockerfile they can be converted from."""
    return sorted(p for p in RECIPE_DIR.iterdir() if p.suffix == ".def" or p.name == "Dockerfile")


def names(paths: list[Path], keep_suffix: bool = False) -> str:
    return ", ".join(p.name if keep_suffix else p.stem for p in paths)


def summary(path: Path, width: int = 90) -> str:
    """The start of a file's leading comment (what the shipped file is for), cut at a word."""
    words = []
    for line in path.read_text().splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("#") or not line.strip("# "):
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def lookup(name: str | Path, folder: Path, suffixes: tuple[str, ...]) -> Path | None:
    """A shipped file by name: `name`, `name<suffix>`, or the last part of a path into the checkout's
    copy (`configs/x.yaml` from another directory)."""
    p = Path(name)
    for cand in (folder / p.name, *(folder / f"{p.name}{s}" for s in suffixes)):
        if cand.is_file():
            return cand
    return None


def recipe(name: str | Path) -> Path:
    """A recipe file as given, else a shipped recipe by name (`ngc-pytorch-23.12`, `.def` optional)."""
    p = Path(name)
    if p.is_file():
        return p
    found = lookup(p, RECIPE_DIR, (".def",))
    if found is None:
        raise NotShipped(
            f"recipe {str(name)!r} not found: give a definition file or a shipped recipe: "
            f"{names(recipes(), keep_suffix=True)} (`hpctrain image list`)"
        )
    return found
