"""Owners and API tokens. Tokens are stored as sha256 hashes; the clear text is shown once.

Functions here flush but never commit: the caller owns the transaction
(``with session_factory.begin() as session: ...``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.store.models import ApiToken, Owner

TOKEN_PREFIX = "accum_"
PREFIX_LENGTH = 12  # "accum_" + 6 characters: enough to tell tokens apart in a listing


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_owner_with_token(session: Session, name: str, admin: bool = False) -> tuple[Owner, str]:
    """Create (or reuse) the owner ``name`` and give it a new token; returns (owner, token).

    An existing owner keeps its jobs and other tokens; ``admin=True`` makes it an admin.
    The clear-text token is returned once and never stored. Does not commit.
    """
    name = name.strip()
    if not name:
        raise ValueError("owner name must not be empty; e.g. `accum token create alice`")
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


def authenticate(session: Session, token: str) -> Owner | None:
    """The owner of ``token``, or None. Read-only.

    The lookup is by sha256 (an attacker learns nothing from index timing about a hash of a
    guess), then the stored hash is compared in constant time.
    """
    if not token:
        return None
    digest = hash_token(token)
    row = session.execute(
        select(ApiToken.token_hash, Owner)
        .join(Owner, Owner.id == ApiToken.owner_id)
        .where(ApiToken.token_hash == digest)
    ).first()
    if row is None or not hmac.compare_digest(row[0], digest):
        return None
    return row[1]
