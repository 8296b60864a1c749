"""Problems: one concrete instance of an operator, and the text its cache key is made of.

A :class:`Problem`'s canonical :attr:`Problem.key` is the cache key, so everything that decides
which algorithms are usable must be in it and nothing else may be.  This module imports no other
part of fastrun: algorithms and operators both speak of problems, and neither needs the other
to do so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Shape = tuple[int, ...]


def value_text(value: Any) -> str:
    """A parameter value as keys and algorithm names write it: 'true', '3', '(1,1)'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(value_text(v) for v in value) + ")"
    return str(value)


def parse_value(text: str) -> Any:
    """Read a parameter value written as text: 'true', '3', '0.5', '1,1' (a tuple), 'SAME'."""
    if "," in text:
        return tuple(parse_value(part) for part in text.split(","))
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class Problem:
    """One concrete operator instance: input shapes, dtypes and parameters."""

    operator: str
    shapes: tuple[Shape, ...]
    dtypes: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()
    key: str = field(init=False, compare=False, repr=False)
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        tensors = ",".join(
            f"{dtype}[{'x'.join(str(d) for d in shape)}]"
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        )
        params = ",".join(f"{name}={value_text(value)}" for name, value in self.params)
        object.__setattr__(self, "key", f"{tensors};{params}" if params else tensors)
        object.__setattr__(self, "_hash", hash((self.operator, self.shapes, self.dtypes,
                                                self.params)))

    def __hash__(self) -> int:
        """Computed once: every kernel's call looks its problem up in a cache or two (its
        geometry, its plan), and hashing the nested tuples again took 0.8 us a time."""
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt from its fields, so that a copy made in another process (a fleet worker's)
        hashes its strings with that process's seed."""
        return Problem, (self.operator, self.shapes, self.dtypes, self.params)

    @classmethod
    def create(cls, operator: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
               params: Mapping[str, Any] | None = None) -> Problem:
        return cls(
            operator,
            tuple(tuple(int(d) for d in shape) for shape in shapes),
            tuple(np.dtype(d).name for d in dtypes),
            tuple(sorted((k, _freeze(v)) for k, v in (params or {}).items())),
        )

    @property
    def params_text(self) -> str:
        """The key's parameter part (what follows the first ``;``), '' without parameters."""
        return self.key.partition(";")[2]

    def param(self, name: str, default: Any = None) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        return default

    @property
    def weight_preprocess(self) -> bool:
        return bool(self.param("weight_preprocess", False))

    def __str__(self) -> str:
        return f"{self.operator}({self.key})"


_TENSOR_TEXT = re.compile(r"([A-Za-z0-9_]+)\[([0-9x]*)\]")


def split_key(key: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], str] | None:
    """(dtypes, shapes, parameter text) of a problem key, None when it is not one: the inverse
    of :attr:`Problem.key` for what a cache stores only as text (the nearest-neighbour index
    reads its keys).  The tensor part holds no ``;``, so the first one ends it, and no ``,``
    inside a tensor."""
    tensors, _, params = key.partition(";")
    dtypes, shapes = [], []
    for part in tensors.split(","):
        match = _TENSOR_TEXT.fullmatch(part)
        if match is None:
            return None
        dtypes.append(match.group(1))
        dims = match.group(2)
        shapes.append(tuple(int(d) for d in dims.split("x")) if dims else ())
    return tuple(dtypes), tuple(shapes), params
