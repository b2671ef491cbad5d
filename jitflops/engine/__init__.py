"""The counting engine: handles over a front end's records, counts per scope and per module (FLOPs,
activations, integer work, parameters, collectives' bytes), fvcore's analyses, and counts as
formulas of the input sizes."""
