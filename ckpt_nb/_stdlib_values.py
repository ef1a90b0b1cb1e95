"""Standard-library values stored as JSON: paths, dates and times, decimals,
fractions, UUIDs, ranges and slices.

They are common in ``extra`` and among a notebook's variables; pickled, they would
come back only with ``trust_pickle=True``. Each is stored by its fields and comes
back as its own type. Exact types only: a subclass (pandas' Timestamp is a
datetime) may hold more than the fields, so it is pickled like any other object.
A time zone is kept where it is a fixed offset (``datetime.timezone``) or an IANA
zone (``zoneinfo.ZoneInfo``); a datetime with any other tzinfo is pickled.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
import zoneinfo
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from pathlib import Path, PosixPath, PurePath, PurePosixPath, PureWindowsPath, WindowsPath
from typing import Any

from ._errors import CorruptCheckpointError, warn

_PATHS: dict[str, type[PurePath]] = {t.__name__: t for t in (
    PurePosixPath, PureWindowsPath, PosixPath, WindowsPath)}
# A concrete path of the other system cannot be made here: it comes back as its pure flavour.
_PURE_OF = {"PosixPath": PurePosixPath, "WindowsPath": PureWindowsPath}
# IANA zone keys as zoneinfo takes them; a key is checked before it names a file to read.
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
_INDEX = (int, type(None))  # a slice of these is stored (others are pickled)

TAGS = frozenset({"__path__", "__datetime__", "__date__", "__time__", "__timedelta__",
                  "__decimal__", "__fraction__", "__uuid__", "__range__", "__slice__"})
TYPES: frozenset[type] = frozenset({*_PATHS.values(), dt.datetime, dt.date, dt.time,
                                    dt.timedelta, Decimal, Fraction, uuid.UUID, range, slice})


class _Unsupported(Exception):
    """A value of one of these types with a part that is not stored as JSON."""


def encode(value: Any) -> dict[str, Any] | None:
    """``value`` as a JSON node, or None where it is none of these (or has a part,
    such as a tzinfo or a slice bound, that is not)."""
    kind = type(value)
    try:
        if kind.__name__ in _PATHS and kind is _PATHS[kind.__name__]:
            return {"__path__": str(value), "type": kind.__name__}
        if kind is dt.datetime:
            return {"__datetime__": [value.year, value.month, value.day, value.hour,
                                     value.minute, value.second, value.microsecond],
                    "fold": value.fold, "tz": _zone(value.tzinfo, value.utcoffset())}
        if kind is dt.date:
            return {"__date__": [value.year, value.month, value.day]}
        if kind is dt.time:
            return {"__time__": [value.hour, value.minute, value.second, value.microsecond],
                    "fold": value.fold, "tz": _zone(value.tzinfo, value.utcoffset())}
        if kind is dt.timedelta:
            return {"__timedelta__": [value.days, value.seconds, value.microseconds]}
        if kind is Decimal:
            return {"__decimal__": str(value)}  # (exact: NaN, -0 and every digit included)
        if kind is Fraction:
            return {"__fraction__": [value.numerator, value.denominator]}
        if kind is uuid.UUID:
            return {"__uuid__": str(value)}
        if kind is range:
            return {"__range__": [value.start, value.stop, value.step]}
        if kind is slice and all(type(v) in _INDEX for v in (value.start, value.stop,
                                                              value.step)):
            return {"__slice__": [value.start, value.stop, value.step]}
    except _Unsupported:
        return None
    return None


def _zone(tz: dt.tzinfo | None, offset: dt.timedelta | None) -> dict[str, Any] | None:
    if tz is None:
        return None
    if type(tz) is dt.timezone:
        fixed = tz.utcoffset(None)
        node: dict[str, Any] = {"offset": _fields(fixed)}
        if tz.tzname(None) != dt.timezone(fixed).tzname(None):
            node["name"] = tz.tzname(None)
        return node
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        # (its offset at this value: what comes back where the zone is not known)
        return {"zone": tz.key, "offset": None if offset is None else _fields(offset)}
    raise _Unsupported


def _fields(delta: dt.timedelta) -> list[int]:
    return [delta.days, delta.seconds, delta.microseconds]


def decode(node: Mapping[str, Any], tag: str, name: str) -> Any:
    """The value a node of ``tag`` (one of ``TAGS``) stands for; a node that does not
    make one raises CorruptCheckpointError naming ``name``."""
    fields = node[tag]
    try:
        if tag == "__path__":
            kind = str(node.get("type"))
            path_type = _PATHS[kind]
            if kind in _PURE_OF and path_type is not type(Path()):
                path_type = _PURE_OF[kind]
            return path_type(_text(fields))
        if tag == "__datetime__":
            return dt.datetime(*_ints(fields, 7), fold=int(node.get("fold", 0)),
                               tzinfo=_tzinfo(node.get("tz"), name))
        if tag == "__date__":
            return dt.date(*_ints(fields, 3))
        if tag == "__time__":
            return dt.time(*_ints(fields, 4), fold=int(node.get("fold", 0)),
                           tzinfo=_tzinfo(node.get("tz"), name))
        if tag == "__timedelta__":
            return dt.timedelta(*_ints(fields, 3))
        if tag == "__decimal__":
            return Decimal(_text(fields))
        if tag == "__fraction__":
            return Fraction(*_ints(fields, 2))
        if tag == "__uuid__":
            return uuid.UUID(_text(fields))
        if tag == "__range__":
            return range(*_ints(fields, 3))
        if tag == "__slice__" and isinstance(fields, list) and len(fields) == 3 \
                and all(type(v) in _INDEX for v in fields):
            return slice(*fields)
    except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise CorruptCheckpointError(f"{name or 'a value'}: its {tag.strip('_')} node "
                                     f"does not decode ({exc})") from exc
    raise CorruptCheckpointError(f"{name or 'a value'}: its {tag.strip('_')} node "
                                 "does not decode")


def _ints(fields: Any, count: int) -> list[int]:
    if not (isinstance(fields, list) and len(fields) == count
            and all(type(v) is int for v in fields)):
        raise ValueError(f"expected {count} integers, found {fields!r}"[:200])
    return fields


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, found {type(value).__name__}")
    return value


def _tzinfo(node: Any, name: str) -> dt.tzinfo | None:
    if node is None:
        return None
    offset = node.get("offset")
    fixed = None if offset is None else dt.timedelta(*_ints(offset, 3))
    if "zone" not in node:
        if fixed is None:
            raise ValueError("a fixed time zone without its offset")
        label = node.get("name")
        return dt.timezone(fixed) if label is None else dt.timezone(fixed, _text(label))
    key = _text(node["zone"])
    if _ZONE_KEY.fullmatch(key):
        try:
            return zoneinfo.ZoneInfo(key)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass
    if fixed is None:
        raise ValueError(f"time zone {key!r} is not known here")
    warn(f"{name or 'a value'}: time zone {key!r} is not known here; it comes "
         f"back with the UTC offset it had ({fixed})", RuntimeWarning)
    return dt.timezone(fixed, key)


def portable(value: Any) -> Any:
    """The plain form of one of these values, for files other tools read:
    ISO 8601 text for dates and times, seconds for a timedelta, text for the rest."""
    if isinstance(value, (dt.date, dt.time)):  # (datetimes included)
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)
