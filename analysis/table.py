"""Plain-text tables for the command line."""

from __future__ import annotations

from typing import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], floatfmt: str = ".4f") -> str:
    """Render rows as an aligned text table; floats use ``floatfmt``, text is left-aligned. A NaN
    is an undefined figure (an acceptance rate with no drafts, the standard error of one
    sequence) and shows as ``-``, never as ``nan`` read as a result; a float of 1e12 or more in
    exponent form (``1.0373e+300``, not its 301 digits)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            if value != value:
                return "-"
            return format(value, ".4e") if 1e12 <= abs(value) < float("inf") else format(value, floatfmt)
        return str(value)

    text = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text:
        widths = [max(w, len(v)) for w, v in zip(widths, row)]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in text)
    return "\n".join(out)
