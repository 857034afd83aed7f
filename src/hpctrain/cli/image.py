"""`hpctrain image …`: build, convert, lint and inspect Apptainer images and recipes; a recipe is a file
or the name of a shipped one (`hpctrain image list`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpctrain import shipped
from hpctrain.cli import CLIError
from hpctrain.images.build import plan_build, run_build
from hpctrain.images.convert import convert_file
from hpctrain.images.lint import lint_file
from hpctrain.images.sif import format_info, read_sif
from hpctrain.shipped import recipe


def add_parser(sub) -> None:
    p = sub.add_parser(
        "image",
        help="Apptainer images: build, convert a Dockerfile, lint a recipe, inspect a SIF",
        description=__doc__,
    )
    isub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    ls = isub.add_parser("list", help="the shipped recipes (names for build, lint, convert)")
    ls.set_defaults(func=list_recipes)

    b = isub.add_parser("build", help="run `apptainer build` with temp/cache dirs on scratch")
    b.add_argument("recipe", help="definition file or shipped recipe name, e.g. ngc-pytorch-23.12")
    b.add_argument("-o", "--output", required=True, help="image to write (IMAGE.sif)")
    b.add_argument("--scratch", help="where APPTAINER_TMPDIR/CACHEDIR go (default $SCRATCH, $TMPDIR or /tmp)")
    b.add_argument(
        "--min-free-gib",
        type=float,
        default=30.0,
        help="free space needed on scratch and next to the output (default 30)",
    )
    b.add_argument(
        "--fakeroot",
        dest="fakeroot",
        action="store_true",
        default=None,
        help="force --fakeroot (default: when not root)",
    )
    b.add_argument("--no-fakeroot", dest="fakeroot", action="store_false")
    b.add_argument("--force", action="store_true", help="overwrite an existing image")
    b.add_argument("--dry-run", action="store_true", help="print the exact command and stop")
    b.set_defaults(func=build)

    c = isub.add_parser("convert", help="Dockerfile → Apptainer definition (spython + fixes)")
    c.add_argument("dockerfile", help="a Dockerfile (Dockerfile: the shipped example, unless ./Dockerfile exists)")
    c.add_argument("-o", "--output", help="definition to write (default: stdout)")
    c.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    c.set_defaults(func=convert)

    li = isub.add_parser("lint", help="check definition files: header, sections, set -e, secrets, %%test")
    li.add_argument("recipes", nargs="+", help="definition files or shipped recipe names")
    li.set_defaults(func=lint)

    i = isub.add_parser("inspect", help="SIF header, objects, labels and embedded definition (no apptainer)")
    i.add_argument("image")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=inspect)


def list_recipes(args: argparse.Namespace) -> int:
    for p in shipped.recipes():
        print(f"  {p.name:24s} {shipped.summary(p)}")
    print(f"(in {shipped.RECIPE_DIR}; `hpctrain image build NAME -o IMAGE.sif` builds one)")
    return 0


def build(args: argparse.Namespace) -> int:

    plan = plan_build(args.recipe, args.output, args.scratch, args.fakeroot, args.force)
    if args.dry_run:
        if plan.staged:
            print(
                f"note: the recipe's %files come from {plan.context}, a copy of this hpctrain made before the build",
                file=sys.stderr,
            )
        print(plan.command_line())
        return 0
    return run_build(plan, Path(args.output), args.min_free_gib)


def convert(args: argparse.Namespace) -> int:
    if args.output and Path(args.output).exists() and not args.force:  # as sbatch-template, before any work
        raise CLIError(f"{args.output} already exists: pass --force to overwrite it, or give another path")
    conv = convert_file(recipe(args.dockerfile))
    for note in conv.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(conv.definition)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(conv.definition)
    return 0


def lint(args: argparse.Namespace) -> int:
    bad = 0
    for name in args.recipes:
        path = recipe(name)
        problems = lint_file(path)
        bad += bool(problems)
        for p in problems:
            print(f"{name}:{p}")
        if not problems:
            print(f"{name}: ok")
    return 1 if bad else 0


def inspect(args: argparse.Namespace) -> int:
    info = read_sif(args.image)
    print(json.dumps(info.to_dict(), indent=2) if args.json else format_info(info))
    return 0
