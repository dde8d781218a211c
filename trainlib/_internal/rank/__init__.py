"""Runs in a rank process (``python -m trainlib._internal.rank.rank_main``): the launch, the
process group, the session the user's training function reports through, uploads."""
