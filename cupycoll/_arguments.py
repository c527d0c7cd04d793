"""The command line's argument types (argparse's ``type=``) of ``cupycoll``'s commands and the
benchmarks: files they write, sizes, checked numbers and names, comma lists. A bad value is a
usage error (exit 2) before any work, not a traceback after it."""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = ["output_file", "plot_file", "made_folder", "checked", "positive_int", "one_of",
           "listed", "parse_size", "parse_length", "SIZE_LIMIT", "NO_MATPLOTLIB"]


def output_file(text: str) -> str:
    """``text`` as a file a command writes (argparse's type, so a path it cannot write is a
    usage error before any measurement, not a traceback after it): not a folder, not a file
    it may not write, under folders it can make (missing ones are made when it writes)."""
    import argparse
    from pathlib import Path

    try:  # (a name the system refuses to look up, e.g. too long, raises OSError; a home
        path = Path(text).expanduser()  # it cannot find, ~nosuchuser, RuntimeError)
        if not text or path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
        if path.exists() and not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text!r} cannot be written")
        folder = path.absolute().parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    except (OSError, RuntimeError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written ({exc})") from None
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text!r} cannot be written: {str(folder)!r} is not a folder it may write in")
    return text


#: what --plot asks for when matplotlib does not import
NO_MATPLOTLIB = "matplotlib is not installed: pip install 'cupycoll[plot]' (or matplotlib)"


def plot_file(text: str) -> str:
    """:func:`output_file` for a drawing, which also needs matplotlib: its absence is a usage
    error before the run, not a traceback after it."""
    import argparse

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise argparse.ArgumentTypeError(NO_MATPLOTLIB) from None
    return output_file(text)


def made_folder(path: Any) -> Any:
    """``path``, its folder made where missing (a file :func:`output_file` accepted)."""
    from pathlib import Path

    Path(path).expanduser().absolute().parent.mkdir(parents=True, exist_ok=True)
    return Path(path).expanduser()


def checked(convert: Callable[[str], Any], ok: Callable[[Any], bool], wanted: str
            ) -> Callable[[str], Any]:
    """argparse's type: ``convert(text)`` where ``ok`` holds of it, else a usage error saying
    ``wanted`` (the commands' and the benchmarks' numbers and names)."""
    import argparse

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (ValueError, TypeError, OverflowError):
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


#: argparse's type of a count of repetitions, ranks, rows: an int >= 1
positive_int = checked(int, lambda v: v >= 1, "an int >= 1")


def one_of(*names: str) -> Callable[[str], str]:
    """argparse's type (within :func:`listed`) of one of ``names``."""
    return checked(str, lambda v: v in names, f"one of {', '.join(names)}")


def listed(item: Callable[[str], Any], least: int = 1) -> Callable[[str], list]:
    """argparse's type of a comma list of ``item``s (``listed(parse_length)``), ``least`` of
    them at least; a bad item is a usage error naming it."""
    import argparse

    def parse(text: str) -> list:
        items = [item(part.strip()) for part in text.split(",") if part.strip()]
        if len(items) < least:
            raise argparse.ArgumentTypeError(f"must be a comma list of {least} or more, got "
                                             f"{text!r}")
        return items

    return parse


#: the largest size :func:`parse_size` takes, exclusive (the sparse API's limit on n)
SIZE_LIMIT = 1 << 62
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, minimum: int = 0) -> int:
    """A size (argparse's type, ``cupycoll simulate --n`` and the benchmarks'): 8, 1e6, 64K,
    16M, 16MB, 16MiB, 2G, 1T (K/M/G/T are powers of 1024, with or without B/iB, as in
    nccl-tests), a whole number from ``minimum`` up to :data:`SIZE_LIMIT` (exclusive);
    anything else raises argparse.ArgumentTypeError saying what is accepted."""
    import argparse
    import decimal
    import re

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*",
                         str(text), re.I)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use a number with an optional K, M, G or T suffix "
            "(powers of 1024; B or iB may follow), e.g. 8, 1e6, 64K, 16M, 16MiB")
    number = decimal.Decimal(match.group(1))  # exact, unlike a float of 19 digits
    if number and number.adjusted() >= 19:  # 1e30: refused before any arithmetic on it
        value = decimal.Decimal(SIZE_LIMIT)
    else:  # exact to 80 digits; a longer fraction is refused as not whole
        exact = decimal.Context(prec=80, traps=[decimal.Inexact])
        try:
            value = exact.multiply(number, _SIZE_UNITS[match.group(2).upper()])
        except decimal.Inexact:
            value = decimal.Decimal("0.5")
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: not a whole number of bytes "
                                         "or elements")
    if not minimum <= value < SIZE_LIMIT:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: " + (
            f"must be at least {minimum}" if value < minimum else "must be below 2**62"))
    return int(value)


def parse_length(text: str) -> int:
    """:func:`parse_size` of a length: at least 1."""
    return parse_size(text, 1)
