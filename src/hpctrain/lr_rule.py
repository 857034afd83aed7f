"""How the peak learning rate came from optim.lr (Config.peak_lr), in words: printed by `hpctrain
submit` on the login node and kept in the run's env.json by the task, so it lives below both."""

from __future__ import annotations

from hpctrain.config import Config


def lr_rule(cfg: Config) -> str:
    """The resolved peak learning rate and how it came from optim.lr, e.g.
    `0.003 (optim.lr 0.003 × 4096/4096, linear scaling)`."""
    o, g = cfg.optim, cfg.data.global_batch
    if not o.lr_ref_batch:
        how = "optim.lr, no batch scaling (optim.lr_ref_batch 0)"
    elif o.lr_scaling == "none":
        how = f"optim.lr as written (optim.lr_scaling none; tuned at {o.lr_ref_batch})"
    elif o.lr_scaling == "sqrt":
        how = f"optim.lr {o.lr:g} × sqrt({g}/{o.lr_ref_batch}), sqrt scaling"
    else:
        how = f"optim.lr {o.lr:g} × {g}/{o.lr_ref_batch}, linear scaling"
    return f"{cfg.peak_lr:.4g} ({how}); {o.name}"
