"""Reading a run back for people: what a run directory and Slurm say about a run, never how to
build or submit its job (that is `launch/`, which imports this package). `hpctrain status` finds
the run (`lookup`), reads its job's state (`jobinfo`) and sums up its records (`summary`), which
`render` writes as text; `logs` prints a rank's log as it grows; `follow` waits for a Slurm job at a
bounded cost (`submit`/`eval --wait`, `logs -f`); `steps` reads a job's steps killed for memory;
`progress` is the pure arithmetic of steps/s and ETA over the metrics.jsonl records and the
progress line `submit` prints; `report` draws several runs' metrics as a PNG or HTML page. All of
it runs on the login node, from JSON lines, sacct and squeue: no torch (matplotlib only when a
figure is drawn).
"""
