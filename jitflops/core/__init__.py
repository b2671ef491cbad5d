"""What every layer shares, below them all: op records and what a front end gives the engine, the
errors, how a model's inputs cross a trace, giving the model back as it was, process groups as data,
which module was running, and the one table drawer."""
