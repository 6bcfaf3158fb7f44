"""One entry of ACCUM_DATA_ROOTS: a root and who may read under it (no other services import).

    DataRootEntry.parse("/datasets")                  # everyone (the format before owners)
    DataRootEntry.parse("alice:/data/alice")          # alice only
    DataRootEntry.parse("alice,bob:/data/team")       # a group: alice and bob
    DataRootEntry.parse("/data/users/{owner}")        # each owner their own folder
    DataRootEntry.parse("carol:s3://datasets/carol")  # s3 prefixes take owners and {owner} too

An entry that starts with ``s3://`` is an s3 root for everyone (``s3`` is no owner list there).
``{owner}`` stands for one whole name in one path part (``/data/{owner}``, ``/data/u-{owner}``):
an owner named ``.`` or ``..`` gets no such folder, as ``/data/..`` would be ``/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OWNER = "{owner}"
# services.jobdb.tokens.OWNER_NAME_PATTERN: the names an owner can have.
OWNER_NAME = r"[A-Za-z0-9._-]{1,64}"
_OWNERS_PREFIX = re.compile(rf"(\*|{OWNER_NAME}(?:,{OWNER_NAME})*):(?=/|s3://)")
EXAMPLES = '"/datasets", "alice:/data/alice", "alice,bob:/data/team", "/data/users/{owner}"'


@dataclass(frozen=True)
class DataRootEntry:
    """A root as written (a path or an ``s3://bucket/prefix``, possibly holding ``{owner}``)
    and the owners who may read under it (None: everyone)."""

    root: str
    owners: frozenset[str] | None = None

    @classmethod
    def parse(cls, text: str) -> DataRootEntry:
        """The entry written as ``[owner[,owner...]:]root``; ValueError saying how to write it."""
        owners: frozenset[str] | None = None
        root = text
        if not text.startswith("s3://") and (prefix := _OWNERS_PREFIX.match(text)):
            root = text[prefix.end():]
            owners = None if prefix[1] == "*" else frozenset(prefix[1].split(","))
        if root.startswith("s3://") and not root.removeprefix("s3://").split("/")[0]:
            raise ValueError(f"ACCUM_DATA_ROOTS entry {text!r} names no bucket; use s3://bucket/prefix")
        if root.count("{") != root.count(OWNER) or root.count("}") != root.count(OWNER):
            raise ValueError(
                f"ACCUM_DATA_ROOTS entry {text!r}: the only placeholder is {OWNER} (the owner's name "
                f"in one path part); entries look like {EXAMPLES}"
            )
        if any(part.count(OWNER) > 1 for part in root.split("/")):
            raise ValueError(f"ACCUM_DATA_ROOTS entry {text!r}: write {OWNER} at most once in a path part")
        if not root:
            raise ValueError(f"ACCUM_DATA_ROOTS entry {text!r} names no root; entries look like {EXAMPLES}")
        return cls(root, owners)

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    @property
    def is_plain(self) -> bool:
        """Everyone's, with no ``{owner}``: the format before owners."""
        return self.owners is None and OWNER not in self.root

    def written(self, root: str | None = None) -> str:
        """The entry as ACCUM_DATA_ROOTS takes it (with ``root`` in place of its own)."""
        root = self.root if root is None else root
        return root if self.owners is None else f"{','.join(sorted(self.owners))}:{root}"
