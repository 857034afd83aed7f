# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
hpctrain_srun=$!
# `wait` returns early (status > 128) at each trapped signal while srun runs on. Once srun has ended, bash
# answers `wait` with its remembered status and its PID may be given to another process, which kill -0
# would take for srun (the loop then spun): go on only while the PID is still this shell's child.
hpctrain_ours() {
  local s
  { read -r s < "/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*) } s=${s#* }  # "PID (comm) STATE PPID …" → "PPID …"
  [ "${s%% *}" = "$$" ]
}
while wait "$hpctrain_srun"; hpctrain_rc=$?; hpctrain_ours "$hpctrain_srun"; do :; done
wait "$hpctrain_srun" 2>/dev/null; hpctrain_w=$?; [ "$hpctrain_w" = 127 ] || hpctrain_rc=$hpctrain_w
hpctrain_decision="" hpctrain_why=""
if [ -f "$HPCTRAIN_STOP_FILE" ]; then
  { read -r hpctrain_decision; read -r hpctrain_why; } < "$HPCTRAIN_STOP_FILE" || true
elif [ "$hpctrain_rc" != 0 ] && { [ -n "$hpctrain_signal" ] || hpctrain_preempted; }; then
  hpctrain_decision=requeue
  hpctrain_why="the tasks ended (exit $hpctrain_rc) after a stop signal before their own checkpoint: resuming from the last one"
fi
