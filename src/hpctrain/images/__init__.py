"""Apptainer images: recipe conversion and lint, `apptainer build` command lines, SIF inspection.

Nothing here imports torch or needs apptainer itself, so it all runs on a login node.
"""

from hpctrain.errors import UserError


class ImageError(UserError):
    """A user-facing image/recipe problem: printed by the CLI as one line."""
