"""The project exception and the input checks every public function uses.

Invalid input raises :class:`DraftsimError`, a subclass of :class:`ValueError`, whose
message names the bad value and the valid range. The CLI prints it as one line on stderr
and exits with status 2.
"""

from __future__ import annotations

import os
import re

import numpy as np

#: Largest draft length any planner searches. Larger values are almost certainly a typo and
#: would make exhaustive searches needlessly slow.
K_MAX_LIMIT = 1024


class DraftsimError(ValueError):
    """Invalid input to draftsim: the message names the value and the valid range."""


def close_names(name, valid, n: int = 3) -> list[str]:
    """Up to ``n`` of ``valid`` that ``name`` may have meant, case-insensitively: names that
    begin with it (three characters or more), the closest spellings
    (:func:`difflib.get_close_matches`, ratio >= 0.6), then names that contain it. ``valid``
    may map spellings (aliases) to the name to suggest for each."""
    import difflib

    spellings = valid if isinstance(valid, dict) else {v: v for v in valid}
    names = {str(k).lower(): str(v) for k, v in reversed(list(spellings.items()))}
    text = str(name).strip().lower()
    longer = len(text) >= 3
    out = [k for k in names if longer and k.startswith(text)][::-1]
    out += difflib.get_close_matches(text, list(names), n=n, cutoff=0.6)
    out += [k for k in names if longer and text in k][::-1]
    return list(dict.fromkeys(names[k] for k in out if k != text and names[k].lower() != text))[:n]


def did_you_mean(name, valid) -> str:
    """``"; did you mean A or B?"`` for a name that is none of ``valid`` (an engine, a dtype, a model, a
    command, ...): a valid name spelled the same but for letter case first (where the names are matched
    exactly), then :func:`close_names`; ``""`` where none is close or the name is blank. ``valid`` may
    map spellings (aliases) to the name to suggest for each."""
    text = str(name).strip()
    if not text:
        return ""
    names = [str(v) for v in (valid.values() if isinstance(valid, dict) else valid)]
    case = [n for n in names if n.lower() == text.lower() and n != text]
    close = list(dict.fromkeys(case + close_names(text, valid)))[:3]
    return f"; did you mean {' or '.join(close)}?" if close else ""


def unknown(kind: str, name, valid, *, known: str | None = None) -> DraftsimError:
    """The one-line error for a name that is none of ``valid`` (raise it): ``unknown KIND 'NAME';
    did you mean A or B? known: …`` — the suggestions of :func:`did_you_mean` (``valid`` may
    map spellings to names), then the valid names (or ``known``, a sentence standing for a list
    too long to print)."""
    hint = did_you_mean(name, valid)
    listed = ", ".join(dict.fromkeys(str(v) for v in (valid.values() if isinstance(valid, dict) else valid))) or "none"
    return DraftsimError(f"unknown {kind} {name!r}{hint}{' ' if hint else '; '}{known if known is not None else 'known: ' + listed}")


def _number(value) -> str:
    """A number as a user typed it: ``3`` for integral values, ``0.25``, ``nan``, ``inf``; past 25
    digits with an exponent (``1e+300``, not the 301 digits of its float)."""
    v = float(value)
    return str(int(v)) if v.is_integer() and abs(v) < 1e25 else repr(v)


def suggest(x: float, side: str, digits: int = 3) -> str:
    """A bound a refusal suggests, ``">= x"`` or ``"<= x"`` (``side``), x shown in ``digits``
    significant digits rounded outward (up for ``>=``, down for ``<=``), so the value printed
    passes the check it suggests."""
    import math

    x = float(x)
    if not math.isfinite(x) or x == 0.0:
        return f"{side} {x:g}"
    text = f"{x:.{digits - 1}e}"
    shown = float(text)
    if (side == ">=" and shown < x) or (side == "<=" and shown > x):
        exponent = text.split("e")[1]
        step = 10.0 ** (int(exponent) - (digits - 1))
        shown = shown + step if side == ">=" else shown - step
        text = f"{shown:.{digits - 1}e}"
    value = float(text)
    return f"{side} {int(value) if value.is_integer() and abs(value) < 1e15 else f'{value:.{digits}g}'}"


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
    """Describe the first offending element of ``arr`` (with its index if ``arr`` is not a scalar)."""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    value = _number(arr[idx] if arr.ndim else arr[()])
    return value if arr.ndim == 0 else f"{value} at index {idx if len(idx) > 1 else idx[0]}"


def shown(x, limit: int = 60) -> str:
    """``repr(x)`` for a message, at most ``limit`` characters: an integer past float's range (from
    a TOML or JSON file) as its digit count — Python's repr refuses ints of over 4,300 digits."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x).bit_length() > 1024:
        return f"an integer of about {int(abs(x).bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(x)
    except ValueError:  # a container holding such an integer
        return f"a {type(x).__name__} holding an integer too long to print"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_float_array(name: str, x) -> np.ndarray:
    """``x`` as a float64 array; non-numeric input (or an integer past float's range) raises
    :class:`DraftsimError`."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except OverflowError as exc:
        raise DraftsimError(f"{name} must be a number within float range (about 1.8e308); got {shown(x)}") from exc
    except (TypeError, ValueError) as exc:
        raise DraftsimError(f"{name} must be a number or an array of numbers; got {shown(x)}") from exc
    return arr


def as_probability(name: str, x) -> np.ndarray:
    """``x`` as a float array with every element in [0, 1] (NaN rejected)."""
    arr = as_float_array(name, x)
    bad = ~((arr >= 0.0) & (arr <= 1.0))
    if bad.any():
        raise DraftsimError(f"{name} must lie in [0, 1]; got {_first_bad(arr, bad)}")
    return arr


def as_cost(name: str, x, maximum: float | None = None) -> np.ndarray:
    """``x`` as a float array of finite, non-negative cost coefficients, each at most ``maximum``
    when given."""
    arr = as_float_array(name, x)
    bad = ~(np.isfinite(arr) & (arr >= 0.0))
    if bad.any():
        raise DraftsimError(f"{name} must be a finite cost >= 0; got {_first_bad(arr, bad)}")
    if maximum is not None and (arr > maximum).any():
        raise DraftsimError(f"{name} must be >= 0 and <= {maximum:,g}; got {_first_bad(arr, arr > maximum)}")
    return arr


def as_positive(name: str, x, maximum: float | None = None) -> np.ndarray:
    """``x`` as a float array of finite, strictly positive values (times, rates), each at most
    ``maximum`` when given (a bound past which the value is a typo, or overflows a float32)."""
    arr = as_float_array(name, x)
    bad = ~(np.isfinite(arr) & (arr > 0.0))
    if bad.any():
        raise DraftsimError(f"{name} must be finite and > 0; got {_first_bad(arr, bad)}")
    if maximum is not None and (arr > maximum).any():
        raise DraftsimError(f"{name} must be > 0 and <= {maximum:,g}; got {_first_bad(arr, arr > maximum)}")
    return arr


#: The largest float that converts to int64 (2**63 − 1024): counts are stored as int64.
_INT64_FLOAT_MAX = float(2**63 - 1024)


def as_count(name: str, x, *, minimum: int = 0, maximum: int | None = None) -> np.ndarray:
    """``x`` as an int64 array of integers in [minimum, maximum].

    Floats are accepted only when integral (``3.0``), never rounded; booleans are refused.
    """
    if isinstance(x, (bool, np.bool_)):
        raise DraftsimError(f"{name} must be an integer; got {shown(x)}")
    arr = as_float_array(name, x)
    upper = _INT64_FLOAT_MAX if maximum is None else min(maximum, _INT64_FLOAT_MAX)
    bad = ~(np.isfinite(arr) & (arr == np.floor(arr)) & (arr >= minimum) & (arr <= upper))
    if bad.any():
        first = arr[bad].flat[0]
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        if maximum is None and np.isfinite(first) and first > upper:
            bound = "below 2**63 (counts and seeds are 64-bit)"
        raise DraftsimError(f"{name} must be an integer {bound}; got {_first_bad(arr, bad)}")
    return arr.astype(np.int64)


def as_k_max(x, name: str = "k_max") -> int:
    """A scalar search bound in [0, K_MAX_LIMIT]."""
    arr = as_count(name, x, minimum=0, maximum=K_MAX_LIMIT)
    if arr.ndim != 0:
        raise DraftsimError(f"{name} must be a single integer; got an array of shape {arr.shape}")
    return int(arr)


#: A number as draftsim reads it from text: ASCII decimal digits only (Python's ``int`` and
#: ``float`` also accept other scripts' digits, such as full-width ``１２``, and ``1_000``).
_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


#: The units a time takes after its number, in seconds (a bare number is seconds).
TIME_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
#: What a time may be written as, for messages.
TIME_FORMS = "a number of seconds, or a number with a unit: us, ms, s, m or min, h (e.g. 500ms, 30, 2m, 1.5h)"
_TIME = re.compile(r"\s*([+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|infinity|inf)|nan)\s*([a-zµ]*)\s*",
                   re.IGNORECASE)


def parse_seconds(name: str, text) -> float:
    """A time as the command line writes it, in seconds: a bare number is seconds; a unit may
    follow (``500ms`` → 0.5, ``2m`` and ``2min`` → 120.0, ``1.5h`` → 5400.0, ``250us``;
    :data:`TIME_UNITS`), blanks allowed between, ASCII digits only. The one reader of every
    time-valued option (``--duration``, ``--slo-ttft``, a closed loop's ``think=``, ...); an SLO's ``VALUE[UNIT]`` can be read
    with it too. Only the form is checked here; the range (> 0, finite) is the caller's."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = _TIME.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise DraftsimError(f"{name} must be a time, {TIME_FORMS}; got {shown(text)}")
    number, unit = m.group(1), m.group(2).lower()
    if unit and unit not in TIME_UNITS:
        raise DraftsimError(f"{name} {text.strip()!r}: unknown unit {unit!r}; valid: {', '.join(TIME_UNITS)} (a bare number is seconds)")
    return float(number) * TIME_UNITS[unit or "s"]


def parse_number(name: str, text: str) -> int | float:
    """``text`` as an int (when written as one) or a float; ASCII digits only.

    Surrounding blanks are ignored; anything else (other scripts' digits, ``1_000``, ``0x10``,
    an empty string) raises :class:`DraftsimError` naming the text.
    """
    if not isinstance(text, str) or not _NUMBER.fullmatch(text.strip()):
        raise DraftsimError(f"{name} must be a number written with ASCII digits (e.g. 0.25, 3, 1e6); got {shown(text)}")
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_numbers(name: str, text: str, count: int | None = None, minimum: int = 1) -> list[float]:
    """Comma-separated ASCII numbers (``"0.9,0.7"``) as floats: no empty items, and exactly
    ``count`` of them (when given) or at least ``minimum``."""
    items = text.split(",") if isinstance(text, str) and text.strip() else []
    if not items or any(not item.strip() for item in items):
        shape = f"{count} comma-separated numbers" if count else "comma-separated numbers (e.g. 0.9,0.7)"
        raise DraftsimError(f"{name} must be {shape}; got {text!r}")
    values = []
    for item in items:
        try:
            parse_number(name, item)
            values.append(float(item.strip()))  # float of the text: an integer past float's range is inf, not an OverflowError
        except DraftsimError:
            raise DraftsimError(f"{name} must be comma-separated numbers written with ASCII digits; got {text!r} ({item.strip()!r})") from None
    if count is not None and len(values) != count:
        raise DraftsimError(f"{name} must be exactly {count} comma-separated numbers; got {len(values)} in {text!r}")
    if len(values) < minimum:
        raise DraftsimError(f"{name} needs at least {minimum} comma-separated numbers; got {len(values)} in {text!r}")
    return values


def file_mode() -> int:
    """The permission bits a new file gets under the process umask (0644 under umask 022).

    :func:`tempfile.mkstemp` creates files with mode 0600; atomic writers (temp file +
    rename) chmod their file to this before the rename.
    """
    return 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def folder_mode() -> int:
    """The permission bits a new folder gets under the process umask (0755 under umask 022);
    :func:`tempfile.mkdtemp` creates 0700."""
    return 0o777 & ~_umask()
