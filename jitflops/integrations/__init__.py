"""Callbacks for the training loops people use (``transformers.Trainer`` and Lightning), and what they
measure of a training step."""
