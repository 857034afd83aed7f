# shellcheck shell=bash
# summary: a job array's element: into its own run directory (hpctrain_runs, by SLURM_ARRAY_TASK_ID)
# shellcheck disable=SC2164  # a failed cd ends the script (set -e)
cd "${hpctrain_runs[${SLURM_ARRAY_TASK_ID:?hpctrain: not an array job}]}"
