# shellcheck shell=bash
# summary: stand-alone script: say which settings came from the environment
# The settings below read the environment; said first, so that a job that runs the defaults says so.
# A site whose sbatch runs with --export=NONE (SBATCH_EXPORT=NONE in login shells) gives the job only
# SLURM_* (sbatch(1), --export=NONE) and SLURM_EXPORT_ENV=NONE: what the user exported stays out.
hpctrain_given=()
for hpctrain_v in CONTAINER HPCTRAIN_IMAGE HPCTRAIN_SOURCE HPCTRAIN_CONFIG HPCTRAIN_SET HPCTRAIN_MODULES \
  HPCTRAIN_CONTAINER_MODULES HPCTRAIN_SPARE_NODES HPCTRAIN_MAX_RESTARTS; do
  if [ -n "${!hpctrain_v+set}" ]; then hpctrain_given+=("$hpctrain_v=${!hpctrain_v}"); fi
done
echo "hpctrain: overrides from the environment: ${hpctrain_given[*]:-none (the defaults below run)}"
if [ "${SLURM_EXPORT_ENV:-}" = NONE ]; then
  echo "hpctrain: this job was submitted with --export=NONE (SBATCH_EXPORT=NONE at this site?): variables" \
    "exported in the submitting shell (CONTAINER, HPCTRAIN_CONFIG, HPCTRAIN_SET, HPCTRAIN_SPARE_NODES ...) cannot" \
    "reach it; pass them with sbatch --export=ALL (or --export=ALL,HPCTRAIN_CONFIG=<file>)" >&2
fi
