"""Reading a run back for people: what a run directory and Slurm say about a run, never how to
build or submit its job (that is `launch/`, which imports this package). `status` tells a run's
state, progress, ETA and logs (`hpctrain status` / `logs`, and the job `submit` and `eval` wait
for); `progress` is the pure arithmetic of steps/s and ETA over the metrics.jsonl records and the
progress line `submit` prints; `report` draws several runs' metrics as a PNG or HTML page. All of
it runs on the login node, from JSON lines, sacct and squeue: no torch (matplotlib only when a
figure is drawn).
"""
