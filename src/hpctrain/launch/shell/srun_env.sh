# shellcheck shell=bash
# summary: srun passes this shell's environment to the tasks (SLURM_EXPORT_ENV=ALL), --cpus-per-task for every srun
# Sites with SBATCH_EXPORT=NONE (or --export=NONE) give the job SLURM_EXPORT_ENV=NONE, and srun
# would pass only SLURM_* on to the tasks (sbatch(1), --export): this shell's environment goes.
export SLURM_EXPORT_ENV=ALL
# srun reads SRUN_EXPORT_ENV over SLURM_EXPORT_ENV (srun(1); opt.c, "overrides SLURM_EXPORT_ENV"): a site
# or a profile that sets SRUN_EXPORT_ENV=NONE would bring that back. Kept when it exports ALL (a module's
# ALL,LD_PRELOAD=...), else replaced.
case ${SRUN_EXPORT_ENV-ALL} in
ALL | ALL,*) ;;
*)
  echo "hpctrain: SRUN_EXPORT_ENV=$SRUN_EXPORT_ENV (a site or profile setting) would give the tasks none of this" \
    "shell's environment: srun runs with SRUN_EXPORT_ENV=ALL" >&2
  export SRUN_EXPORT_ENV=ALL
  ;;
esac
# srun 22.05-23.02 takes --cpus-per-task from SRUN_CPUS_PER_TASK only; 23.11 and later read
# SLURM_CPUS_PER_TASK (set by the allocation) and ignore SRUN_CPUS_PER_TASK: this covers both.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
  export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi
