# shellcheck shell=bash
# summary: signals are never lost: long commands run in the background and are waited for through traps
# Signals are never lost (docs/launch.md, "Signals in the batch shell"). bash runs a trap only once the
# foreground command ends (bash(1), SIGNALS: "the trap will not be executed until the command
# completes"), and a $(…) is one too: a USR2 that came during an image copy, a probe step or
# slurmctld retries would wait for them, past the stop's lead time. So every long command of this
# shell runs in the background and is waited for with `wait`, which a trapped signal ends at once
# (status > 128): the trap runs, and the wait goes on while the command runs.
hpctrain_ours() {  # $1 is still a child of this (sub)shell: an ended one's PID may belong to another process now
  local s
  { read -r s < "/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*) } s=${s#* }  # "PID (comm) STATE PPID …" → "PPID …"
  [ "${s%% *}" = "$BASHPID" ]
}
hpctrain_wait() {  # wait for the child $1 through trapped signals; its exit status
  local rc w
  # each trapped signal ends `wait` early (> 128) while $1 runs on. Once it has ended, bash answers `wait`
  # with its remembered status and its PID may be another process's: go on only while it is our child
  while wait "$1"; rc=$?; hpctrain_ours "$1"; do :; done
  wait "$1" 2>/dev/null; w=$?; [ "$w" = 127 ] || rc=$w
  return "$rc"
}
hpctrain_fg() {  # "$@" (a command or a function) as a foreground command whose wait a trapped signal interrupts
  "$@" &
  hpctrain_wait "$!"
}
hpctrain_out() {  # [-2] VAR CMD…: VAR= CMD's output as $(CMD) gives it (-2: stderr too), run by hpctrain_fg
  local hpctrain_o_f hpctrain_o_rc hpctrain_o_2=""
  if [ "$1" = -2 ]; then hpctrain_o_2=1; shift; fi
  if ! hpctrain_o_f=$(mktemp "${TMPDIR:-/tmp}/hpctrain-out.XXXXXX" 2>/dev/null); then
    # no temporary file here: as $(…), with the trap deferred until CMD ends
    if [ -n "$hpctrain_o_2" ]; then hpctrain_o_f=$("${@:2}" 2>&1); else hpctrain_o_f=$("${@:2}"); fi
    hpctrain_o_rc=$?
    printf -v "$1" '%s' "$hpctrain_o_f"
    return "$hpctrain_o_rc"
  fi
  if [ -n "$hpctrain_o_2" ]; then hpctrain_fg "${@:2}" > "$hpctrain_o_f" 2>&1; else hpctrain_fg "${@:2}" > "$hpctrain_o_f"; fi
  hpctrain_o_rc=$?
  printf -v "$1" '%s' "$(cat -- "$hpctrain_o_f")"
  rm -f -- "$hpctrain_o_f"
  return "$hpctrain_o_rc"
}
hpctrain_bg_add() {  # $1: a child of this shell to end at exit
  hpctrain_bg+=("$1")
}
hpctrain_bg_end() {
  local p
  for p in ${hpctrain_bg[@]+"${hpctrain_bg[@]}"}; do
    if hpctrain_ours "$p"; then kill "$p" 2>/dev/null || true; fi
  done
  hpctrain_bg=()
}
# hpctrain_setup_signals: the background helpers, ended at exit
hpctrain_setup_signals() {
  # The background helpers (a heartbeat, a warm-up step): ended as this shell ends, on every path.
  hpctrain_bg=()
  hpctrain_at_exit+=(hpctrain_bg_end)
}
