# shellcheck shell=bash
# summary: load HPCTRAIN_CONTAINER_MODULES (the runtime's command); stop only if the runtime is then missing
# HPCTRAIN_CONTAINER_MODULES (default: apptainer) only puts the container runtime on PATH, where a site
# may have it already: a module that is missing, or no module system at all, is a warning; the job
# stops only when the runtime is then not found.
if [ -n "$hpctrain_modules" ] && [ -z "$hpctrain_modules_host" ]; then
  if ! type module >/dev/null 2>&1; then
    echo "hpctrain: warning: no module command in this shell (no Lmod or Environment Modules found):" \
      "HPCTRAIN_CONTAINER_MODULES=$hpctrain_modules not loaded" >&2
  elif read -r -a hpctrain_module_names <<< "$hpctrain_modules" && ! module load "${hpctrain_module_names[@]}"; then
    echo "hpctrain: warning: module load $hpctrain_modules failed (no such module at this site?):" \
      "going on with the $CONTAINER on PATH" >&2
  fi
  case $hpctrain_runtime_commands in
  *" $CONTAINER "*)  # a runtime that starts each task with its own command (site/runtimes/: `command`)
    if ! command -v "$CONTAINER" >/dev/null 2>&1; then
      echo "hpctrain: $CONTAINER is not on PATH, and HPCTRAIN_CONTAINER_MODULES=$hpctrain_modules did not put it" \
        "there: set HPCTRAIN_CONTAINER_MODULES to the module that provides it, or CONTAINER to another runtime" >&2
      exit 1
    fi
    ;;
  esac
fi
