"""`hpctrain doctor`: what this node (or this container) has, and what is wrong with it for
distributed training.

Runs on a login node without torch or DALI (versions.py imports torch only where installed), on
a compute node, or inside the image. Every finding is a `checks.Check` with a status
(ok/info/warn/fail) and a hint that says what to do; `fail` makes `hpctrain doctor` exit 1.
One module per concern: versions (software and GPUs), gpus (PCI/NUMA), fabric (IB/RoCE ports,
NCCL_IB_HCA, GID), env (NCCL_*/GLOO_* a job sees), container, limits; report runs them all.
"""
