"""The site: what a cluster is and how hpctrain learns it. Cluster profiles, container runtimes, the
fabric (NCCL and gloo interfaces) and `hpctrain cluster init`'s discovery. Used by
the login node (plans, jobs) and the task (fabric); it imports nothing above the base modules."""
