"""Offline data preparation: runs on a login node or in a prep job, never in the training task.

The task's loaders (data/torch_loader.py, data/dali.py) and what they share with preparation (the
folder listing, the shard format, node-local staging, the progress meter) stay one level up; this
package imports them, never the reverse. Torch-free: `hpctrain data ...` commands import it.
"""
