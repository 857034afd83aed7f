# shellcheck shell=bash
# summary: raise the locked-memory limit as far as the node allows (NCCL over InfiniBand/RoCE)
# Locked memory: the login shell's soft limit came with the job (PropagateResourceLimits); NCCL over
# InfiniBand/RoCE locks its buffers: raise it as far as this node's hard limit allows.
ulimit -S -l unlimited 2>/dev/null || ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
