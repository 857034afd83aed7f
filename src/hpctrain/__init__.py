"""hpctrain: Vision Transformer training from a laptop to multi-node Slurm clusters."""

__version__ = "0.5.0"
