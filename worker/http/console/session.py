"""Logging in to the console with an API key: a session the server keeps, named by a signed,
HttpOnly, SameSite=Strict cookie.

The session is a record in the store (`store/credentials.py`, by the SHA-256 of a random id
that only the cookie holds): the key it logged in with, its CSRF token and when it ends. The
server can end it: logout deletes the record, and revoking the key deletes every record of
the key's (`apikeys.end_sessions`); a cookie kept after either names nothing, and its CSRF
token, kept only in the record, is no one's. Every request also looks the key up again by
its id, so a revoked key's sessions end on their next request whatever is left. A session ends
when its time is up (`session_s`: the record expires then, and the time signed into the cookie
is checked too, whatever the browser keeps). Every form post carries the session's token,
checked here (the login form, before there is a session, the token of a short-lived cookie of
its own).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import itsdangerous
import msgspec
import redis

from turnstile.errors import TurnstileError
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.console.settings import ConsoleSettings
from turnstile.worker.store import credentials

SESSION_COOKIE = "turnstile_console"
LOGIN_COOKIE = "turnstile_console_login"  # the login form's token, before there is a session
FLASH_COOKIE = "turnstile_console_flash"  # one message for the next page shown
SECRET = credentials.CONSOLE_SECRET  # the shared signing secret, when none is configured
LOGIN_FORM_S = 3600  # how long a login form may wait before it is sent
FLASH_S = 120


class ConsoleError(TurnstileError):
    """A console request that cannot be served as asked: the page says why, nothing changed."""

    status = 400


class LoginNeededError(ConsoleError):
    """No session, or one that ended (expired, its key revoked): log in again."""

    status = 401


class FormRefusedError(ConsoleError):
    """A form post whose CSRF token is not this session's: refused, nothing changed."""

    status = 403


class OperatorOnlyError(ConsoleError):
    status = 403


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the live key the session names, and the session's CSRF token."""

    key: ApiKey
    csrf: str
    expires_at: float
    session: str  # the SHA-256 of the session's id: its record's name in the store

    @property
    def operator(self) -> bool:
        return self.key.operator

    def require_operator(self) -> None:
        if not self.operator:
            raise OperatorOnlyError("this page needs an operator key; this key sees its own tenant")


class _Cookie(msgspec.Struct):
    """What the session cookie holds, signed: the session's id, and when it ends."""

    sid: str
    expires_at: float


class _Record(msgspec.Struct):
    """What the store holds of a session: who, its CSRF token, and when it ends."""

    key_id: str
    csrf: str
    expires_at: float


def _hash(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


class Sessions:
    """Issues and reads the console's cookies, signed with one secret for every server."""

    def __init__(self, store: redis.Redis, settings: ConsoleSettings) -> None:
        self.store, self.settings = store, settings
        self._secret = settings.secret

    def _signer(self, salt: str) -> itsdangerous.URLSafeTimedSerializer:
        if not self._secret:
            # Made once by whichever server asks first; a store that does not answer here is a
            # 503 page, like any other read of it.
            self._secret = credentials.signing_secret(self.store, secrets.token_urlsafe(32))
        return itsdangerous.URLSafeTimedSerializer(self._secret, salt=salt)

    # -- the session -------------------------------------------------------------------------

    def issue(self, key: ApiKey) -> tuple[str, Viewer]:
        """A new session for a verified key, recorded in the store: the cookie's value and who
        it makes the caller."""
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        expires_at = time.time() + self.settings.session_s
        session, ttl_s = _hash(sid), self.settings.session_s
        record = msgspec.json.encode(_Record(key.id, csrf, expires_at))
        credentials.start_session(self.store, key.id, session, record, ttl_s)
        value = self._signer("session").dumps(msgspec.to_builtins(_Cookie(sid, expires_at)))
        return value, Viewer(key, csrf, expires_at, session)

    def end(self, viewer: Viewer) -> None:
        """End the session at once (logout): its cookie names nothing after this."""
        credentials.end_session(self.store, viewer.key.id, viewer.session)

    def viewer(self, cookie: str | None) -> Viewer:
        """Who the session cookie names; LoginNeededError, saying why, when it names no one live."""
        if not cookie:
            raise LoginNeededError("log in with an API key")
        try:
            raw = self._signer("session").loads(cookie, max_age=self.settings.session_s)
            signed = msgspec.convert(raw, _Cookie)
        except itsdangerous.SignatureExpired:
            raise LoginNeededError("your session expired: log in again") from None
        except (itsdangerous.BadData, msgspec.ValidationError):
            raise LoginNeededError("your session is not valid here: log in again") from None
        if signed.expires_at <= time.time():
            raise LoginNeededError("your session expired: log in again")
        session = _hash(signed.sid)
        stored = credentials.session(self.store, session)
        if stored is None:
            raise LoginNeededError(
                "your session has ended (logged out, or its key was revoked): log in again"
            )
        record = msgspec.json.decode(stored, type=_Record)
        found = credentials.key_record(self.store, record.key_id)
        key = None if found is None else msgspec.json.decode(found, type=ApiKey)
        if key is None or key.revoked_at:
            raise LoginNeededError("the key of this session was revoked: log in with a live key")
        return Viewer(key, record.csrf, record.expires_at, session)

    # -- the login form's token, before there is a session ------------------------------------

    def login_token(self) -> tuple[str, str]:
        """(the cookie's value, the token for the form)."""
        token = secrets.token_urlsafe(24)
        return self._signer("login").dumps(token), token

    def check_login_token(self, cookie: str | None, sent: str) -> None:
        try:
            token = self._signer("login").loads(cookie or "", max_age=LOGIN_FORM_S)
        except itsdangerous.BadData:
            token = None
        if not isinstance(token, str) or not sent or not hmac.compare_digest(token, sent):
            raise FormRefusedError(
                "the login form was not this browser's, or waited too long: "
                "nothing was done; log in again from this page"
            )

    # -- one message for the next page ---------------------------------------------------------

    def flash(self, kind: str, text: str) -> str:
        return self._signer("flash").dumps([kind, text])

    def read_flash(self, cookie: str | None) -> tuple[str, str] | None:
        if not cookie:
            return None
        try:
            kind, text = self._signer("flash").loads(cookie, max_age=FLASH_S)
        except (itsdangerous.BadData, ValueError, TypeError):
            return None
        return str(kind), str(text)


def check_csrf(viewer: Viewer, sent: str | None) -> None:
    """A form post must carry the session's token: a page of another site cannot know it."""
    if not sent or not hmac.compare_digest(viewer.csrf, sent):
        raise FormRefusedError(
            "this form was not sent from a page of this session (its security token does not "
            "match): nothing was changed; reload the page and try again"
        )
