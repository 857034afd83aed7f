"""Models. Import `hpctrain.models.vit` directly: it needs torch."""
