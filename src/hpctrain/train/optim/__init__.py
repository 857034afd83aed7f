"""How the weights move: the optimizers (AdamW with a bf16 first moment, LAMB, SGD), the loop their
Adam family shares, the parameter groups and the warm-up + cosine schedule (build.py), and the EMA
of the weights, which is updated after each optimizer step as torch.optim.swa_utils' AveragedModel
is. Kept light on purpose (a docstring, no re-exports): importing one module loads only its own."""
