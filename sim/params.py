"""Small parameter objects (rules, policies): a mixin giving repr, equality and hash from the
public attributes, and the command-line mini-language ``NAME[:KEY=VALUE[,KEY=VALUE...]]``."""

from __future__ import annotations

import re

from .errors import DraftsimError


def parse_spec(spec: str, kind: str, known: dict[str, dict]) -> tuple[str, dict[str, str]]:
    """Split ``NAME:KEY=VALUE,...`` into the name and its raw values, checking names and keys
    against ``known`` (name -> {key: anything}). Commas inside a value (lists) are kept: a
    new item starts only where ``KEY=`` follows the comma."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in known:
        raise DraftsimError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")
    keys = known[name]
    params: dict[str, str] = {}
    if rest:
        for item in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", rest):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not value.strip():
                raise DraftsimError(f"{kind} {name}: expected KEY=VALUE, got {item!r}")
            if key not in keys:
                raise DraftsimError(f"{kind} {name}: unknown parameter {key!r}; known: {', '.join(keys) or 'none'}")
            if key in params:
                raise DraftsimError(f"{kind} {name}: parameter {key!r} given twice")
            params[key] = value.strip()
    return name, params


class Parametrised:
    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))
