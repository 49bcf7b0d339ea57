"""Training DFlash and DFlash 2 drafters against a frozen mlx-lm target.

What is trained is the drafter of docs/algorithm.md §1–§3; the target, its
embedding and its LM head stay frozen.
"""
