"""A mixin for small parameter objects (rules, policies): repr, equality and hash from the
public attributes, so that two objects built with the same parameters compare equal."""

from __future__ import annotations


class Parametrised:
    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))
