"""Integrations of ``trainlib.tune`` with other libraries, at Ray Tune's module paths."""
