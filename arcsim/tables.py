"""Reading back a CSV table arcsim wrote: every declared column parsed by its type, or one error line.

A cell that does not parse (``no`` in a yes/no column, text or an empty cell in a number column, zero where a
time must be positive, the header repeated inside the table) is refused with its line and column rather than
read as something else."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from arcsim.errors import ArcsimError

if TYPE_CHECKING:
    import pandas as pd

BOOLEANS = {"True": True, "False": False}  # what pandas writes for a Python bool


@dataclass(frozen=True)
class Column:
    """How one column's cells parse: ``kind`` int, float, bool or str; ``positive``: numbers above 0;
    ``required``: the column must be there and no cell empty (else an empty cell reads as NaN or None)."""

    kind: type
    positive: bool = False
    required: bool = True

    def parse(self, text: str) -> object:
        """One cell's value; ValueError with what was expected."""
        if text == "" and not self.required:
            return float("nan") if self.kind in (int, float) else None
        if self.kind is bool:
            if text not in BOOLEANS:
                raise ValueError("True or False")
            return BOOLEANS[text]
        if self.kind is str:
            if not text:
                raise ValueError("a name")
            return text
        number: float | int
        try:
            number = int(text) if self.kind is int else float(text)
        except ValueError:
            raise ValueError("a whole number" if self.kind is int else "a number") from None
        if not math.isfinite(number):
            raise ValueError("a finite number")
        if self.positive and number <= 0:
            raise ValueError("a number above 0")
        return number


def read_table(path: Path, columns: Mapping[str, Column], what: str, error: type[ArcsimError] = ArcsimError
               ) -> pd.DataFrame:
    """The table at ``path`` with the declared ``columns`` parsed by their type (others as pandas infers them);
    a header alone gives no rows. ``what`` names the table in errors, e.g. "the validation.csv arcsim wrote"."""
    import pandas as pd

    if not path.is_file():
        raise error(f"{path} does not exist; give {what}")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (UnicodeDecodeError, csv.Error) as err:
        raise error(f"{path} is not {what} ({' '.join(str(err).split())})") from None
    if not rows or not rows[0]:
        raise error(f"{path} is empty; give {what}")
    header, body = rows[0], [r for r in rows[1:] if r]
    repeated = sorted({c for c in header if header.count(c) > 1})
    missing = [c for c, col in columns.items() if col.required and c not in header]
    if repeated or missing:
        problem = f"the column {', '.join(repeated)} twice" if repeated else f"no column {', '.join(missing)}"
        raise error(f"{path} is not {what}: {problem}")
    if not body:
        return pd.DataFrame(columns=header)
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise error(f"{path} line {line} has {len(row)} cells where the header has {len(header)} (cut off by "
                        f"an interrupted write?); give {what}")
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise error(f"{path} is not {what} ({' '.join(str(err).split())})") from None
    for name, column in columns.items():
        if name not in header:
            continue
        at = header.index(name)
        values = []
        for line, row in enumerate(body, start=2):
            try:
                values.append(column.parse(row[at]))
            except ValueError as expected:
                raise error(f"{path} line {line}, column {name}: {row[at]!r} is not {expected}; give {what}") from None
        series = pd.Series(values, index=frame.index, dtype=object)
        frame[name] = pd.to_numeric(series) if column.kind in (int, float) else series
    return frame
