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

import numpy as np

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

    def parse_all(self, cells: pd.Series) -> pd.Series | None:
        """Every cell at once when each is plainly what :meth:`parse` accepts (the common case, fast); None
        otherwise, and :meth:`parse` goes cell by cell."""
        import pandas as pd

        empty = cells == ""
        if self.required and empty.any():
            return None
        if self.kind is bool:
            return cells.map(BOOLEANS) if cells.isin(BOOLEANS).all() else None
        if self.kind is str:
            return cells.where(~empty, None)
        plain = cells.str.fullmatch(r"-?\d+") if self.kind is int else pd.Series(True, index=cells.index)
        numbers = pd.to_numeric(cells.where(~empty, "nan"), errors="coerce")
        fine = (plain & np.isfinite(numbers) & (numbers > 0 if self.positive else True)) | empty
        return numbers if fine.all() else None


def _inferred(cells: pd.Series) -> pd.Series:
    """A column no declaration covers: numbers when every filled cell is one (empty: NaN), else the text."""
    import pandas as pd

    numbers = pd.to_numeric(cells.where(cells != "", None), errors="coerce")
    return numbers if numbers.notna().sum() == (cells != "").sum() else cells


def read_table(path: Path, columns: Mapping[str, Column], what: str, error: type[ArcsimError] = ArcsimError
               ) -> pd.DataFrame:
    """The table at ``path`` with the declared ``columns`` parsed by their type (others as pandas infers them);
    a header alone gives no rows. ``what`` names the table in errors, e.g. "the validation.csv arcsim wrote"."""
    import pandas as pd

    if not path.is_file():
        raise error(f"{path} does not exist; give {what}")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            ragged = next(((reader.line_num, len(row)) for row in reader if row and len(row) != len(header)), None)
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise error(f"{path} is empty; give {what}") from None
    except (ValueError, UnicodeDecodeError, csv.Error) as err:  # pandas' ParserError is a ValueError
        raise error(f"{path} is not {what} ({' '.join(str(err).split())})") from None
    if not header:
        raise error(f"{path} is empty; give {what}")
    repeated = sorted({c for c in header if header.count(c) > 1})
    missing = [c for c, col in columns.items() if col.required and c not in header]
    if repeated or missing:
        problem = f"the column {', '.join(repeated)} twice" if repeated else f"no column {', '.join(missing)}"
        raise error(f"{path} is not {what}: {problem}")
    if ragged is not None:
        raise error(f"{path} line {ragged[0]} has {ragged[1]} cells where the header has {len(header)} (cut off by "
                    f"an interrupted write?); give {what}")
    frame = raw.copy()
    for name in frame.columns:  # the columns not declared: as pandas would infer them
        if name not in columns:
            frame[name] = _inferred(raw[name])
    for name, column in columns.items():
        if name not in header:
            continue
        cells = raw[name]
        parsed = column.parse_all(cells)
        if parsed is None:  # some cell needs a closer look: parse one by one, to name the first at fault
            values = []
            for line, text in enumerate(cells, start=2):
                try:
                    values.append(column.parse(text))
                except ValueError as expected:
                    raise error(f"{path} line {line}, column {name}: {text!r} is not {expected}; give {what}") from None
            parsed = pd.Series(values, index=frame.index, dtype=object)
        frame[name] = pd.to_numeric(parsed) if column.kind in (int, float) else parsed
    return frame
