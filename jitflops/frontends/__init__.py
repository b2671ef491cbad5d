"""Front ends: the ways a model becomes op records with module scopes. The JIT trace (the default, on
meta values where that pays off, with its fallback and mask readings), the dispatch recording of
what runs, and the static reading of an ``ExportedProgram``."""
