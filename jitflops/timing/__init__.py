"""Measured time: the timed eager pass per module, a training step's timing, the peak FLOP/s a device
reaches, and the calibration of this machine."""
