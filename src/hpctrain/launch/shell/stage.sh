# shellcheck shell=bash
# summary: container.stage_image: stage the image the way $CONTAINER's runtime does, if it stages
# One function per runtime that stages (launch/stage_image.py): the SIF copy step of apptainer and
# singularity (stage_step.sh), pyxis's clean-up of its named containers (pyxis_clean.sh).
# hpctrain_setup_stage: the image staged the way $CONTAINER's runtime stages it, if it does
hpctrain_setup_stage() {
  if declare -F "hpctrain_stage_$CONTAINER" >/dev/null; then
    "hpctrain_stage_$CONTAINER"
  fi
}
