"""Callbacks for the training loops people use: ``transformers.Trainer`` and Lightning."""
