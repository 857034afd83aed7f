# shellcheck shell=bash
# summary: container.stage_image under pyxis: a --container-name per job attempt and image
# container.stage_image under pyxis: the --container-name of this job's attempt and image. pyxis
# reuses a container by its name alone, and under its default container_scope=global never removes a
# named one (docs/runtimes.md, "Staging the image"): a name per job id only would hand a requeued attempt
# the rootfs the previous attempt unpacked from an older image. The requeue count and the image's
# checksum (image_identity.sh) make a new name for each; in-job restarts (spares) keep this one.
hpctrain_pyxis_job=${SLURM_JOB_ID:-$$}
for hpctrain_v in "$hpctrain_pyxis_job" "${SLURM_RESTART_COUNT:-0}"; do
  case $hpctrain_v in ''|*[!0-9]*)
    echo "hpctrain: SLURM_JOB_ID ($hpctrain_pyxis_job) and SLURM_RESTART_COUNT (${SLURM_RESTART_COUNT:-})" \
      "name the pyxis container and must be whole numbers: run the script through sbatch, or unset them" >&2
    exit 1 ;;
  esac
done
hpctrain_pyxis_name=hpctrain-$hpctrain_pyxis_job-r${SLURM_RESTART_COUNT:-0}-img$(hpctrain_image_cksum "$HPCTRAIN_IMAGE")
HPCTRAIN_SRUN_CONTAINER+=(--container-name="$hpctrain_pyxis_name")  # unpacked once per node and attempt
