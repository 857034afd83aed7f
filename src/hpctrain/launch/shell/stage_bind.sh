# shellcheck shell=bash
# summary: data.stage_to, per task: bind the node-local directory into the image
# data.stage_to, expanded with the variables of this node: bind it (Apptainer binds only $HOME, /tmp,
# /var/tmp and $PWD by default); skipped where a variable it names is not set
hpctrain_ok=1
for n in "${hpctrain_stage_dir_needs[@]}"; do [ -n "${!n:-}" ] || hpctrain_ok=""; done
if [ -n "$hpctrain_ok" ]; then
  d=${hpctrain_stage_dir?}; mkdir -p "$d" && set -- "$1" "$2" --bind "$d" "${@:3}"
fi
