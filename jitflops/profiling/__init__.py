"""Profiles: counts, bytes and time in one module hierarchy, the per-op table, generation step by step,
FLOPs per token, and profiles gathered across ranks."""
