"""Algorithm attributes: the properties a strategy can require or forbid.

They are flags rather than booleans on the algorithm so that a strategy can be expressed as a
(required, forbidden) pair of attribute sets and checked with two bit operations.
"""

from __future__ import annotations

import enum
import functools


class AlgoAttribute(enum.Flag):
    NONE = 0
    #: Bit-identical results run to run (no atomics, no thread-count dependent reduction order).
    REPRODUCIBLE = enum.auto()
    #: The plain reference algorithm: usable for every parameter set, slow.
    NAIVE = enum.auto()
    #: Whether the algorithm is usable depends on the concrete shapes, not only on the parameters.
    USABLE_DEPEND_ON_SHAPE = enum.auto()
    #: Numerical results of one sample may change with the batch size it is computed in.
    ACCURACY_DEPEND_ON_BATCH = enum.auto()

    def names(self) -> list[str]:
        """Flag names in declaration order (stable text for caches, JSON and tables)."""
        return list(_names(self.value))

    @classmethod
    def from_names(cls, names: list[str] | tuple[str, ...]) -> AlgoAttribute:
        result = cls.NONE
        for name in names:
            try:
                result |= cls[name]
            except KeyError:
                raise ValueError(
                    f"unknown algorithm attribute {name!r}; known: "
                    f"{', '.join(m.name for m in cls if m.value)}"
                ) from None
        return result

    def text(self) -> str:
        return "|".join(self.names()) or "-"


@functools.cache
def _names(value: int) -> tuple[str, ...]:
    """The names of a flag value, worked out once: a cache writes them for every entry it
    stores, and walking the enum each time was a third of a put's cost."""
    flags = AlgoAttribute(value)
    return tuple(member.name for member in AlgoAttribute if member.value and member in flags)
