"""The site: what a cluster is and how hpctrain learns it. Cluster profiles, container runtimes, the
fabric (NCCL and gloo interfaces), `hpctrain cluster init`'s discovery and the login node's Slurm
client (slurm_cli.py). Used by the login node (plans, jobs) and the task (fabric); it imports
nothing above the base modules."""
