"""Apptainer images: recipe conversion and lint, `apptainer build` command lines, SIF inspection.

Nothing here imports torch or needs apptainer itself, so it all runs on a login node.
"""


class ImageError(Exception):
    """A user-facing image/recipe problem: printed by the CLI as one line."""
