"""Owners and API tokens. Tokens are stored as sha256 hashes; the clear text is shown once.

Functions here flush but never commit: the caller owns the transaction
(``with session_factory.begin() as session: ...``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, make_transient_to_detached

from services.jobdb.models import ApiToken, Owner
from services.jobdb.types import utcnow

# Owner names are shown in tables, logs and file names, and passed on command lines: no
# spaces, newlines or control characters (one with a newline broke `accum token list`).
OWNER_NAME_PATTERN = r"[A-Za-z0-9._-]{1,64}"
TOKEN_PREFIX = "accum_"
PREFIX_LENGTH = 12  # "accum_" + 6 characters: enough to tell tokens apart in a listing
# `last_used_at` is written at most once a minute per token: a write on every request would
# cost every GET a transaction commit (and on SQLite the write lock).
LAST_USED_RESOLUTION_S = 60
# Set in ``session.info`` when `authenticate` wrote `last_used_at`: the caller commits it.
TOUCHED = "accum_token_touched"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_owner_with_token(session: Session, name: str, admin: bool = False) -> tuple[Owner, str]:
    """Create (or reuse) the owner ``name`` and give it a new token; returns (owner, token).

    An existing owner keeps its jobs and other tokens; ``admin=True`` makes it an admin.
    The clear-text token is returned once and never stored. Does not commit.
    """
    name = name.strip()
    if not re.fullmatch(OWNER_NAME_PATTERN, name):
        raise ValueError(
            f"owner name {name[:80]!r} is not allowed: use 1 to 64 letters, digits, '.', '_' "
            "or '-'; e.g. `accum token create alice`"
        )
    owner = session.scalar(select(Owner).where(Owner.name == name))
    if owner is None:
        owner = Owner(name=name, is_admin=admin)
        session.add(owner)
        session.flush()  # assigns owner.id
    elif admin:
        owner.is_admin = True
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiToken(owner_id=owner.id, token_hash=hash_token(token), prefix=token[:PREFIX_LENGTH])
    )
    session.flush()
    return owner, token


# Every API request runs this: built once, run on the session's connection as Core (no ORM
# statement handling or row loading), it costs about half what the ORM query did.
_AUTHENTICATE = (
    select(ApiToken.id.label("token_id"), ApiToken.token_hash, ApiToken.last_used_at,
           Owner.id, Owner.name, Owner.is_admin, Owner.created_at)
    .join(Owner, Owner.id == ApiToken.owner_id)
    .where(ApiToken.token_hash == bindparam("digest"), ApiToken.revoked_at.is_(None))
)


def authenticate(session: Session, token: str) -> Owner | None:
    """The owner of ``token`` (detached, its attributes loaded), or None.

    The lookup is by sha256 (an attacker learns nothing from index timing about a hash of a
    guess), then the stored hash is compared in constant time. When the token's
    ``last_used_at`` is older than a minute it is updated on ``session`` and
    ``session.info[TOUCHED]`` is set: the caller commits (nothing else is written).
    """
    if not token:
        return None
    digest = hash_token(token)
    row = session.connection().execute(_AUTHENTICATE, {"digest": digest}).first()
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at >= timedelta(seconds=LAST_USED_RESOLUTION_S):
        session.execute(update(ApiToken).where(ApiToken.id == row.token_id).values(last_used_at=now))
        session.info[TOUCHED] = True
    owner = Owner(id=row.id, name=row.name, is_admin=row.is_admin, created_at=row.created_at)
    make_transient_to_detached(owner)  # as if loaded: reading an attribute never queries
    return owner


def created_at(session: Session, token: str) -> datetime | None:
    """When ``token`` (given in clear) was made, or None for an unknown token."""
    return session.scalar(select(ApiToken.created_at).where(ApiToken.token_hash == hash_token(token)))


def owner_names(session: Session, owner_ids: set[int]) -> dict[int, str]:
    """Owner id -> name for ``owner_ids`` (one query; an admin's job list shows whose job is whose)."""
    if not owner_ids:
        return {}
    rows = session.execute(select(Owner.id, Owner.name).where(Owner.id.in_(owner_ids)))
    return {owner_id: name for owner_id, name in rows}


def list_tokens(
    session: Session, owner_name: str | None = None, include_revoked: bool = False
) -> list[tuple[str, str, datetime, datetime | None, datetime | None]]:
    """``(owner name, prefix, created_at, revoked_at, last_used_at)`` of every live token (one
    owner's with ``owner_name``; revoked ones too with ``include_revoked``), oldest first. Only
    the prefix is known: the clear text was shown once, at creation. ``last_used_at`` is to the
    minute (None: never used)."""
    query = select(
        Owner.name, ApiToken.prefix, ApiToken.created_at, ApiToken.revoked_at, ApiToken.last_used_at
    ).join(Owner, Owner.id == ApiToken.owner_id)
    if owner_name is not None:
        query = query.where(Owner.name == owner_name)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    rows = session.execute(query.order_by(ApiToken.id))
    return [(name, prefix, created, revoked, used) for name, prefix, created, revoked, used in rows]


def revoke_token(session: Session, token_or_prefix: str, owner_id: int | None = None) -> int:
    """Revoke the live token given in clear or by its prefix (as `accum token list` shows it);
    returns how many were revoked (0 or 1). The row stays, with ``revoked_at`` set (the audit
    trail `accum token list --all` shows); the next request that presents the token is
    refused: every request looks its token up. With ``owner_id``, only that owner's tokens
    are candidates. Raises ValueError when a prefix matches several live tokens. Does not
    commit.
    """
    value = token_or_prefix.strip()
    if len(value) > PREFIX_LENGTH:
        where = ApiToken.token_hash == hash_token(value)
    elif len(value) == PREFIX_LENGTH:
        where = ApiToken.prefix == value
    else:
        raise ValueError(
            f"give the whole token or its {PREFIX_LENGTH}-character prefix "
            "(`accum token list` shows the prefixes)"
        )
    query = select(ApiToken.id).where(where, ApiToken.revoked_at.is_(None))
    if owner_id is not None:
        query = query.where(ApiToken.owner_id == owner_id)
    ids = list(session.scalars(query))
    if len(ids) > 1:
        raise ValueError(
            f"prefix {value!r} matches {len(ids)} tokens; give the whole token to revoke one"
        )
    if ids:
        session.execute(update(ApiToken).where(ApiToken.id == ids[0]).values(revoked_at=utcnow()))
    return len(ids)
