"""What the owner says about a job, given at submit: `tags` and `notes` (spec fields), later
changed with `PATCH /v1/jobs/{id}` (the same bounds: ``services.api.schemas.JobEdit``).

    tags: [sweep-3, baseline]      # letters, digits, _ . : -; 1 to 40 each, at most 20
    notes: "lr 0.2 diverged at 0.4; trying warm-up"

They are the job's metadata, not how it trains: ``JobSpec.normalised`` leaves them out (the
job row keeps them, editable), so a spec's hash, and its idempotency, ignore them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidatorFunctionWrapHandler

from services.spec.errors import spec_error

TAG_PATTERN = r"^[A-Za-z0-9_.:-]{1,40}$"
MAX_TAG_LENGTH = 40
MAX_TAGS = 20
MAX_NOTES_LENGTH = 10_000
# Control characters other than newline and tab (C0, DEL, C1), as services.api.control_text
# refuses them in every request body: a spec read from a file gets the same answer.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def tags(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Tags, each once, in the order given."""
    example = 'e.g. ["sweep-3", "baseline"]'
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        raise spec_error("tags", f"tags must be a list of at most {MAX_TAGS} tags, {example}; "
                         f"got {_shown(value)}")
    for index, tag in enumerate(value):
        if not isinstance(tag, str) or not re.fullmatch(TAG_PATTERN, tag):
            raise spec_error(
                "tag", f"tags[{index}]: a tag is 1 to {MAX_TAG_LENGTH} letters, digits or _ . : - "
                f"(no spaces), {example}; got {_shown(tag)}")
    return list(dict.fromkeys(value))


def notes(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_NOTES_LENGTH:
        raise spec_error("notes", f"notes must be text of at most {MAX_NOTES_LENGTH:,} characters, "
                         f"or left out; got {_shown(value)}")
    if found := _CONTROL.search(value):
        raise spec_error("control_character", f"notes holds the control character "
                         f"U+{ord(found.group()):04X} at offset {found.start()}: remove it "
                         "(newlines and tabs are allowed)")
    return value.strip() or None


def _shown(value: Any) -> str:
    """A bad value as the error quotes it: at most 60 characters of its repr."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
