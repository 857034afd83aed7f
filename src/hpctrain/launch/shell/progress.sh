# shellcheck shell=bash
# summary: the progress ledger: count only the requeues that made no new checkpoint (slurm.max_requeues)
# Progress (run/requeue.py): slurm.max_requeues counts only the attempts that ended without a checkpoint
# newer than the one they started from. The ledger has one line per Slurm attempt: restart, the run's
# checkpoints/latest at its start (- for none), its checkpoints directory. Rank 0 writes the first
# attempt's line (this shell does not know the run yet); from the second on, this shell writes it here,
# before any task starts, from the directory the last line names: an attempt that never reaches rank 0
# (a node that fails at start) has its line all the same.
hpctrain_ckpt_latest() {  # the run's checkpoints/latest now (- none; empty: the run is not known yet)
  local d l
  [ -s "$hpctrain_progress_file" ] || return 0
  d=$(tail -n 1 "$hpctrain_progress_file" | cut -f3)
  [ -n "$d" ] || return 0
  l=$(head -n 1 "$d/latest" 2>/dev/null | tr -d '\000-\037') || l=""
  printf '%s\n' "${l:--}"
}
hpctrain_progress_start() {  # the checkpoint attempt $1 started from (empty: no line)
  [ -s "$hpctrain_progress_file" ] || return 0
  awk -F'\t' -v r="$1" '$1 == r { print $2; exit }' "$hpctrain_progress_file" || true
}
# attempts before this one that ended without progress and were not preempted (as requeue.stalled)
hpctrain_stalled() {  # $1: the checkpoint now
  local pre="$HPCTRAIN_CONTROL_DIR/preempted-${SLURM_JOB_ID:-none}"
  [ -e "$pre" ] || pre=/dev/null
  awk -F'\t' -v R="${SLURM_RESTART_COUNT:-0}" -v now="$1" '
    FILENAME == ARGV[1] { pre[$1] = 1; next }
    !($1 in s) { s[$1] = $2 }
    END {
      n = 0
      for (a = 0; a < R; a++) {
        if (a in pre) continue
        if (!(a in s)) { n++; continue }
        after = now
        for (b = a + 1; b <= R; b++) if (b in s) { after = s[b]; break }
        if (after == s[a]) n++
      }
      print n
    }' "$pre" "$hpctrain_progress_file"
}
# hpctrain_setup_progress: this attempt's line of the ledger (from the second attempt on)
hpctrain_setup_progress() {
  local latest
  hpctrain_progress_file="$HPCTRAIN_CONTROL_DIR/progress-${SLURM_JOB_ID:-none}"
  latest=$(hpctrain_ckpt_latest)
  if [ -n "$latest" ] && [ -z "$(hpctrain_progress_start "${SLURM_RESTART_COUNT:-0}")" ]; then
    printf '%s\t%s\t%s\n' "${SLURM_RESTART_COUNT:-0}" "$latest" \
      "$(tail -n 1 "$hpctrain_progress_file" | cut -f3)" >> "$hpctrain_progress_file" || true
  fi
}
