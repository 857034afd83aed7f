"""The run directory as code: what lives in it, and the rules both sides keep about it.

The task writes a run directory, the login node and the batch shell read it; everything here is
torch-free (login nodes import it) and imports nothing above `<base>`. One concern per module:

- `layout`: the names of its files and folders, atomic writes, JSON records, finding a run;
- `metrics`: metrics.jsonl, its record format, and progress lines;
- `rundir`: the lock that gives the directory to one job at a time;
- `finished`: a finished run is not trained again;
- `source`: the code snapshot a job runs (`<root>/code/<hash>`);
- `requeue`: the stop file and the requeue budgets; `badnodes`: the bad-node file;
  `faultlog`: the batch shell's restarts and exclusions, as metrics records.
"""
