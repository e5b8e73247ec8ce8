"""Typed command configurations: every option declared once, as a dataclass field.

A command's configuration is a dataclass whose fields carry an :class:`Option` in their
metadata (use :func:`option`): help text, the type that reads and checks a value (the
:mod:`draftsim.args` types: ``probability``, ``cost``, ``positive``, ``count`` — same checks
and messages as the Python API), choices, and where it shows in ``--help``. From that one
declaration come

- the command's argparse options (:func:`add_options`): the flag is ``--`` + the field name
  with dashes; ``aliases`` are deprecated spellings that still work;
- a configuration from a parsed command line (:func:`from_namespace`);
- a configuration from a table of values, as a sweep point gives one (:func:`from_mapping`):
  names as the flags without ``--`` (dashes or underscores), each value read by the option's
  own type, so a bad value gives the message the command line gives;
- the check of a configuration built in Python (:func:`check`).

Result types are dataclasses too (:func:`typed` fills one from a simulator's nested dict;
:func:`as_dict` gives its JSON); sweep kinds name their metrics as attribute paths into
them, checked when a kind is registered (:class:`draftsim.analysis.sweep.Kind`).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Callable, Mapping

import numpy as np

from draftsim.sim.errors import DraftsimError, did_you_mean


@dataclass(frozen=True)
class Option:
    """How a configuration field shows as a command-line option.

    ``type`` reads the text of one value (raising ``argparse.ArgumentTypeError`` with the
    message) and may carry ``.check(value)``, the same check on a Python value; ``flag``: a
    switch (``store_true``); ``append``: repeatable, collected in a list; ``positional``: an
    argument without ``--``; ``nargs`` and ``const`` as argparse's; ``group``: the ``--help`` section;
    ``exclusive``: options sharing this name exclude each other; ``aliases``: other flags
    accepted for it; ``cli``: False for a field only Python callers set.
    """

    help: str = ""
    type: Callable[[str], Any] | None = None
    choices: tuple | None = None
    metavar: str | None = None
    group: str | None = None
    flag: bool = False
    append: bool = False
    required: bool = False
    positional: bool = False
    nargs: str | None = None
    const: Any = None
    exclusive: str | None = None
    aliases: tuple[str, ...] = ()
    cli: bool = True


def option(default: Any = None, help: str = "", *, default_factory: Callable | None = None, **kwargs) -> Any:
    """A dataclass field declared as a command option (:class:`Option` in its metadata)."""
    meta = {"option": Option(help=help, **kwargs)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def options(cls) -> dict[str, tuple[dataclasses.Field, Option]]:
    """The command options of a configuration class, by field name, in declaration order."""
    return {f.name: (f, f.metadata["option"]) for f in fields(cls) if "option" in f.metadata and f.metadata["option"].cli}


def flag_of(name: str) -> str:
    """The command-line flag of a field: ``verify_per_token`` → ``--verify-per-token``."""
    return "--" + name.replace("_", "-")


def default_of(f: dataclasses.Field):
    """A configuration field's default value (its factory's product for a list)."""
    return _default(f)


def _default(f: dataclasses.Field):
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def add_options(parser: argparse.ArgumentParser, cls, groups: Mapping[str, str] | None = None) -> None:
    """Add every option of configuration class ``cls`` to ``parser``.

    ``groups`` maps a group name to its ``--help`` title (default: the name); groups show in
    the order their first option is declared.
    """
    made: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for name, (f, opt) in options(cls).items():
        where = parser
        if opt.group is not None:
            if opt.group not in made:
                made[opt.group] = parser.add_argument_group((groups or {}).get(opt.group, opt.group))
            where = made[opt.group]
        if opt.exclusive is not None:
            if opt.exclusive not in exclusive:
                exclusive[opt.exclusive] = where.add_mutually_exclusive_group()
            where = exclusive[opt.exclusive]
        kwargs: dict[str, Any] = {"help": opt.help or None}
        if opt.positional:
            if opt.metavar:
                kwargs["metavar"] = opt.metavar
            if opt.nargs:
                kwargs["nargs"] = opt.nargs
            where.add_argument(name, **kwargs)
            continue
        kwargs["dest"] = name
        if opt.flag:
            kwargs["action"] = "store_true"
        else:
            if opt.append:
                kwargs["action"] = "append"
            if opt.type is not None:
                kwargs["type"] = opt.type
            elif opt.choices is None and opt.nargs is None and _default(f) is None:
                kwargs["type"] = _given(flag_of(name))
            if opt.choices is not None:
                kwargs["choices"] = opt.choices
            if opt.metavar is not None:
                kwargs["metavar"] = opt.metavar
            if opt.nargs is not None:
                kwargs["nargs"] = opt.nargs
                kwargs["const"] = opt.const
            if opt.required:
                kwargs["required"] = True
            kwargs["default"] = _default(f)
        where.add_argument(flag_of(name), *opt.aliases, **kwargs)


def _given(flag: str) -> Callable[[str], str]:
    """The text of a plain option whose absence (None) has a meaning, refusing an empty value:
    commands test such an option for truth, so ``--target ''`` or ``--policy=`` was the option
    left out — silently — instead of the value it looks like."""

    def text(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{flag} is empty ({value!r}); give a value or leave {flag} out")
        return value

    text.__name__ = "text"
    return text


def from_namespace(cls, ns: argparse.Namespace, **extra):
    """The configuration a parsed command line holds (fields the parser lacks keep their
    defaults; ``extra`` sets fields by name)."""
    values = {name: getattr(ns, name) for name in options(cls) if hasattr(ns, name)}
    return cls(**values, **extra)


def _text(value) -> str:
    """A table value as command-line text (``0.1``, ``7``, ``fixed:k=4``, ``true``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def _read(name: str, opt: Option, value):
    """One value of option ``name`` from a table, read as its command-line text would be."""
    flag = flag_of(name)
    text = _text(value)
    if opt.type is not None:
        try:
            out = opt.type(text)
        except argparse.ArgumentTypeError as exc:
            raise DraftsimError(f"argument {flag}: {exc}") from None
        except (TypeError, ValueError):
            raise DraftsimError(f"argument {flag}: invalid {getattr(opt.type, '__name__', 'value')} value: {text!r}") from None
    else:
        out = text
    if opt.choices is not None and out not in opt.choices:
        raise DraftsimError(f"argument {flag}: invalid choice: {out!r}{did_you_mean(out, opt.choices)} "
                            f"(choose from {', '.join(repr(c) for c in opt.choices)})")
    return out


def canonical(cls, key: str) -> str | None:
    """The field a table key names (flag spelling without ``--``, dashes or underscores,
    aliases included), or None."""
    name = key.replace("-", "_")
    known = options(cls)
    if name in known:
        return name
    for field_name, (_, opt) in known.items():
        if any(a[2:].replace("-", "_") == name for a in opt.aliases):
            return field_name
    return None


def from_mapping(cls, values: Mapping[str, Any], command: str, **extra):
    """A configuration from a table (option → value, as a sweep point holds one), read with
    the options' own types: the command line's checks and messages.

    A flag takes true or false; a repeatable option a list (or one value); any other option
    one value. ``command`` names the command in the message for an unknown option.
    """
    known = options(cls)
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = canonical(cls, key)
        shown = flag_of(key)
        if name is None:
            raise DraftsimError(f"draftsim {command} has no option {shown}; its options: {', '.join(sorted(known))}")
        opt = known[name][1]
        if name in out:
            raise DraftsimError(f"{flag_of(name)} is set twice ({', '.join(opt.aliases)}: its old spelling); set it once")
        if opt.flag:
            if not isinstance(value, bool):
                raise DraftsimError(f"{shown} is a flag: give true or false; got {value!r}")
            out[name] = value
            continue
        if isinstance(value, bool):
            raise DraftsimError(f"{shown} takes a value, not {str(value).lower()}")
        if isinstance(value, list):
            if not (opt.append or opt.nargs in ("+", "*")):
                raise DraftsimError(f"{shown} takes one value; got the list {value!r} (to vary it, put it in [grid], [[zip]] or [random])")
            out[name] = [_read(name, opt, v) for v in value]
        else:
            v = _read(name, opt, value)
            out[name] = [v] if (opt.append or opt.nargs in ("+", "*")) else v
    missing = [flag_of(n) for n, (_, o) in known.items() if o.required and n not in out and n not in extra]
    if missing:
        raise DraftsimError(f"draftsim {command}: the following arguments are required: {', '.join(missing)}")
    return cls(**out, **extra)


def check(config) -> None:
    """Check a configuration built in Python with the options' own checks: each value's range
    (the types' ``.check``), choices, required options, one value or a list as declared."""
    for name, (_, opt) in options(type(config)).items():
        value = getattr(config, name)
        flag = flag_of(name)
        if value is None:
            if opt.required:
                raise DraftsimError(f"{flag} is required")
            continue
        if opt.flag:
            if not isinstance(value, bool):
                raise DraftsimError(f"{flag} is a flag: give True or False; got {value!r}")
            continue
        many = opt.append or opt.nargs in ("+", "*")
        if many and not isinstance(value, (list, tuple)):
            raise DraftsimError(f"{flag} takes a list of values; got {value!r}")
        for v in (value if many else [value]):
            checker = getattr(opt.type, "check", None)
            if checker is not None:
                checker(v)
            if opt.choices is not None and v not in opt.choices:
                raise DraftsimError(f"{flag} must be one of {', '.join(map(str, opt.choices))}; got {v!r}{did_you_mean(v, opt.choices)}")


def as_dict(value) -> Any:
    """A result (dataclasses, numpy values, nested) as plain JSON-ready Python values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_dict(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): as_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_dict(v) for v in value]
    if isinstance(value, np.ndarray):
        return as_dict(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _options_of(hint) -> list:
    """The member types of ``X | Y | None`` (None dropped), or [hint]."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return [t for t in typing.get_args(hint) if t is not type(None)]
    return [hint]


def typed(cls, data):
    """Dataclass ``cls`` filled from a nested dict (as the simulators report results): each
    field from the key of its name, nested dataclasses in turn, None where a key is absent."""
    if data is None or isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise DraftsimError(f"{cls.__name__} is made from a mapping; got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        value = data.get(f.name)
        inner = [t for t in _options_of(hints[f.name]) if dataclasses.is_dataclass(t)]
        values[f.name] = typed(inner[0], value) if inner and value is not None else value
    return cls(**values)
