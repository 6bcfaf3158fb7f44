"""No control characters in what a request stores (issue 42 item 2): a 422 at the field's path.

    app = FastAPI(dependencies=[Depends(refuse_control_characters)])

Notes, names, tags, data paths and every other string of a JSON body are shown later to
whoever views the job (an admin included) by the CLI, the dashboard and logs; an ESC or a BEL
in them would drive that person's terminal (window titles, OSC 52 clipboard writes, a cleared
screen). So every string and key of every JSON body is refused when it holds a control
character other than newline and tab, before the route runs: one check, for every route with
a body, present and future. (The CLI escapes what it prints as well, services/cli/output.py:
text stored before this check, and a job's own output, which no request carries.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fastapi import Request

from services.api.errors import FieldRefusal, invalid_fields

NAMES = {"\x00": "NUL", "\x07": "BEL", "\x08": "BS", "\r": "CR", "\x1b": "ESC", "\x7f": "DEL", "\x9b": "CSI"}
MAX_REFUSALS = 20


# Unicode's control characters (category Cc: C0, DEL, C1) but newline and tab, as one scan in C.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def control_character(text: str) -> tuple[int, str] | None:
    """(offset, character) of the first control character in `text` other than newline and
    tab (C0, DEL and C1), or None."""
    found = CONTROL.search(text)
    return None if found is None else (found.start(), found.group())


def _strings(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path, string) of every string in a JSON value, keys included (at the key's own path)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,), key
            yield from _strings(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, path + (index,))


def control_character_refusals(body: Any) -> list[FieldRefusal]:
    """A refusal at `body.<path>` for each string of `body` with a control character."""
    refusals: list[FieldRefusal] = []
    for path, text in _strings(body, ("body",)):
        if (found := control_character(text)) is None:
            continue
        offset, char = found
        name = f" ({NAMES[char]})" if char in NAMES else ""
        refusals.append((path, (
            f"control character U+{ord(char):04X}{name} at offset {offset} is not allowed here: "
            "use printable text (newline and tab are allowed)"), text[:200], None))
        if len(refusals) == MAX_REFUSALS:
            break
    return refusals


async def refuse_control_characters(request: Request) -> None:
    """The app's dependency: a JSON body with a control character in a string is a 422 naming
    each such field. A body that is no JSON is left to the route's own parsing (its 422).

    The body is the one the route parsed: FastAPI reads a route's JSON body with
    ``request.json()`` before it solves dependencies, and Starlette keeps the result on the
    request, so it is decoded once (a route without a body model: here, once)."""
    if request.method not in ("POST", "PUT", "PATCH") or not await request.body():
        return
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return
    if refusals := control_character_refusals(body):
        raise invalid_fields(refusals)
