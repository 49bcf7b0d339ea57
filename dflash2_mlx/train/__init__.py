"""Training DFlash and DFlash 2 drafters against a frozen mlx-lm target (spec §4)."""
