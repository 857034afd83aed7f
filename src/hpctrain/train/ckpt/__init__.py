"""Checkpoints: the files (one file by rank 0, or DCP shards by every rank), what one holds and how
the Trainer writes and restores it (checkpointer.py), what a resume checks before it starts, and the
export of either format to one timm-named state_dict. No re-exports: `hpctrain export` on a login
node imports only what it needs, when it runs."""
