"""Small parameter objects (rules, policies): a mixin giving repr, equality and hash from the
public attributes, and the command-line mini-language ``NAME[:KEY=VALUE[,KEY=VALUE...]]``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .errors import DraftsimError, unknown


def parse_spec(spec: str, kind: str, known: dict[str, dict]) -> tuple[str, dict[str, str]]:
    """Split ``NAME:KEY=VALUE,...`` into the name and its raw values, checking names and keys
    against ``known`` (name -> {key: anything}). Commas inside a value (lists) are kept: a
    new item starts only where ``KEY=`` follows the comma."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in known:
        raise unknown(kind, name, sorted(known))
    keys = known[name]
    params: dict[str, str] = {}
    if rest:
        for item in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", rest):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not value.strip():
                raise DraftsimError(f"{kind} {name}: expected KEY=VALUE, got {item!r}")
            if key not in keys:
                raise DraftsimError(f"{kind} {name}: {unknown('parameter', key, keys)}")
            if key in params:
                raise DraftsimError(f"{kind} {name}: parameter {key!r} given twice")
            params[key] = value.strip()
    return name, params


_ASCII_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_ASCII_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)", re.ASCII | re.IGNORECASE)


def ascii_int(text: str) -> int:
    """An integer written in ASCII digits (Python's int() also reads full-width digits)."""
    if not _ASCII_INT.fullmatch(text.strip()):
        raise ValueError(text)
    return int(text)


def ascii_float(text: str) -> float:
    """A number written in ASCII (digits, sign, point, exponent, inf/nan)."""
    if not _ASCII_FLOAT.fullmatch(text.strip()):
        raise ValueError(text)
    return float(text)


def ascii_ints(text: str) -> list[int]:
    """A comma-separated list of integers."""
    return [ascii_int(v) for v in text.split(",")]


def ascii_matrix(text: str) -> list[list[int]]:
    """An integer matrix: rows separated by ';', entries by ','."""
    return [ascii_ints(row) for row in text.split(";")]


@dataclass(frozen=True)
class Param:
    """One ``KEY=VALUE`` of a spec: the command-line key, how its text converts, the argument
    name of the builder (default: the key) and whether it must be given."""

    key: str
    convert: Callable[[str], Any]
    arg: str | None = None
    required: bool = False


@dataclass(frozen=True)
class Entry:
    """One name of a spec family: the builder (a class or a factory taking the parameters as
    keyword arguments), its parameters, and its ``--help`` lines as (usage, description)."""

    name: str
    build: Callable[..., Any]
    params: tuple[Param, ...] = ()
    help: tuple[tuple[str, str], ...] = ()
    aliases: tuple[str, ...] = ()


class Registry:
    """A spec family (policies, rules, …): the table its mini-language is parsed from and its
    ``--help`` text is generated from. Adding a member is one :class:`Entry`."""

    def __init__(self, kind: str, entries: Sequence[Entry], footer: str = "", plural: str | None = None,
                 base: type | None = None):
        self.kind = kind
        #: The domain type the family builds: an instance given where a spec is expected is the
        #: object itself (the typed API takes ``policy=FixedK(4)`` as well as ``"fixed:k=4"``).
        self.base = base
        self.plural = plural or f"{kind}s"
        self.entries = {name: e for e in entries for name in (e.name, *e.aliases)}
        self.footer = footer

    @property
    def help(self) -> str:
        """The ``--help`` epilog: one line per usage, descriptions aligned (continued lines
        of a description, and descriptions of long usages, go on the next lines)."""
        pad = " " * 38
        lines = [f"{self.plural.capitalize()} on the command line: NAME[:KEY=VALUE[,KEY=VALUE...]]"]
        for entry in dict.fromkeys(self.entries.values()):
            for usage, text in entry.help:
                first, *rest = text.split("\n") if text else [""]
                if len(usage) < 36:
                    lines.append(f"  {usage:<36}{first}".rstrip())
                else:
                    lines.append(f"  {usage}")
                    rest = [first, *rest] if first else rest
                lines.extend(pad + line for line in rest)
        return "\n".join(lines + ([self.footer] if self.footer else []))

    def parse(self, spec: str):
        """Build the object ``spec`` names, e.g. ``fixed:k=5``; an object of the family's
        domain type is returned as it is."""
        if self.base is not None and isinstance(spec, self.base):
            return spec
        if not isinstance(spec, str) or not spec.strip():
            raise DraftsimError(f"empty {self.kind} spec; known: {', '.join(sorted(self.entries))}")
        name, raw = parse_spec(spec, self.kind, {n: [p.key for p in e.params] for n, e in self.entries.items()})
        entry = self.entries[name]
        kwargs = {}
        for param in entry.params:
            if param.key not in raw:
                if param.required:
                    example = next((u for u, _ in entry.help if "=" in u), f"{entry.name}:{param.key}=...")
                    raise DraftsimError(f"{self.kind} {entry.name} needs {param.key} (e.g. {example.split('[')[0]})")
                continue
            try:
                kwargs[param.arg or param.key] = param.convert(raw[param.key])
            except DraftsimError as exc:  # a converter that says what is wrong
                raise DraftsimError(f"{self.kind} {entry.name}: {exc}") from None
            except ValueError:
                raise DraftsimError(f"{self.kind} {entry.name}: {param.key}={raw[param.key]!r} is not a valid value") from None
        return entry.build(**kwargs)


class Parametrised:
    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))
