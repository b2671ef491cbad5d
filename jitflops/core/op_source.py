"""What the counting engine reads from a front end (the JIT trace, or the dispatch recording)."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

from .records import OpRecord


class OpSource(Protocol):
    """The ops one forward (and backward) ran, with their module scopes.

    Scopes are full paths of canonical module names from the root, joined by ``/``, the root being
    ``""``: ``"/encoder/encoder.layer.0"``. ``operations`` yields ``(kind, item)`` cheaply; the
    engine asks ``scope_of`` and ``record`` only for the ops it counts or reports, and ``parts`` only
    for an op it has no handle for: the ops it is made of (a custom autograd Function's traced
    forward), counted in its place.
    """

    def operations(self) -> Iterator[tuple[str, Any]]: ...

    def scope_of(self, item: Any) -> str: ...

    def record(self, item: Any, kind: str, module: str) -> OpRecord: ...

    def scopes(self) -> Iterator[str]: ...

    def parts(self, item: Any) -> Sequence[tuple[str, Any]]: ...

    def replay_warnings(self, mode: str) -> None:
        """Show again what the front end warned about while recording (``tracer_warnings`` mode)."""
