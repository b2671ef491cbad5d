"""Estimates before the model runs: the bytes each op moves, the device table, time predicted from a
roofline, and the memory of inference and training steps."""
