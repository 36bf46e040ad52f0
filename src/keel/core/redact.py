"""Keeping secrets off the record: events, artifacts, logs (pure: the I/O side hands it values).

What a `Redactor` replaces, wherever it appears in text it is given:

- the values it holds, as ``[redacted:NAME]``. They come from the environment
  (`environment_secrets`: values of variables whose names look secret — ``*KEY*``,
  ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*PASSWD*``, ``*CREDENTIAL*`` — at least
  six characters long) and from ``.env`` files (`dotenv_secrets`: the same, plus any
  value shaped like a credential whatever its name, see `looks_like_credential`).
  Where values overlap (``abcd`` and ``cdef`` in ``abcdef``) each is redacted whole:
  ``[redacted:A][redacted:C]``, no part of either left;
- credentials inside URLs, known or not: ``scheme://user:PASSWORD@host`` keeps scheme,
  user and host and becomes ``scheme://user:[redacted]@host``; a user part with no
  password that is itself shaped like a token (``https://ghp_…@github.com``) becomes
  ``https://[redacted]@github.com``. An e-mail address has no ``://`` and is never
  touched, nor is an ordinary user (``ssh://git@host``).

A password found in a variable's URL (``DATABASE_URL=postgres://u:S3cretPass@h/db``) is
also held as a value, so it is redacted where it appears on its own — when it could not
be an ordinary word or number (at least 8 characters, letters and non-letters mixed):
redacting a lone ``postgres`` everywhere would garble the log and hide nothing.

Known gaps: a URL password holding a raw ``/``, ``?``, ``#``, quote or whitespace (URLs
must percent-encode them) ends the match early; secrets in other encodings (base64 of
``user:pass`` in an Authorization header) are only caught as held values.

Cost: all held values are compiled into one trie-shaped regular expression (values
sharing a prefix share its branch), so scrubbing a text is one left-to-right pass whose
work per character is bounded by the trie's fan-out, not by the number of values:
thousands of values cost about what a few do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MIN_SECRET_LENGTH = 6  # shorter values would redact ordinary words
MIN_CREDENTIAL_LENGTH = 16  # a value this long, shaped like a token, is a credential by shape
MIN_LONE_PASSWORD_LENGTH = 8  # a URL password redacted on its own, outside its URL
REDACTED = "[redacted]"
URL_CREDENTIAL = "a credential in a URL"  # how `Redactor.secrets_in` names an unheld one

_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_\-+/=.]+")
_DOTTED_NAME = re.compile(r"[a-z0-9_\-]+(?:\.[a-z0-9_\-]+)+")  # host, package, version
_LETTER_DIGIT = re.compile(r"[A-Za-z](?=[0-9])|[0-9](?=[A-Za-z])")
_MIN_LETTER_DIGIT_MIXES = 3
# ``://`` (or ``:\/\/`` in JSON-escaped text) after a scheme character, then userinfo
# up to the authority's last ``@``: the password may hold ``@`` and ``:``, never ``/``.
_URL_USERINFO = re.compile(
    r"(?<=[A-Za-z0-9+.\-])(?P<sep>://|:\\/\\/)"
    r"(?P<user>[^\s:/\\?#@\[\]\"'<>]*)"
    r"(?::(?P<password>[^\s/\\?#\"'<>]*))?"
    r"@"
)
_MAX_NESTING = 100  # groups nested in one compiled trie (the regex compiler recurses)

_Trie = dict[str, "_Trie"]
_END = ""  # key marking that a value ends at this trie node


def looks_secret(name: str) -> bool:
    """True when a variable's name says its value is a secret (``OPENAI_API_KEY``)."""
    return bool(SECRET_NAME.search(name))


def looks_like_credential(value: str) -> bool:
    """True when ``value`` alone is shaped like a generated key or token.

    The rule: at least 16 characters of ``[A-Za-z0-9_-+/=.]`` (the alphabets of hex,
    base64 and API keys), where a letter sits next to a digit at least three times, as
    in random strings (``sk-live-7f3a9c1e…``, ``wJalrXUtnFEMI/K7MDENG``). Ordinary
    settings are not: ``production`` and ``localhost`` are short and have no digit,
    ``invoice_service_v2`` mixes once, ``db-01.internal.example.com`` is a dotted
    lower-case name, ``/var/lib/app2`` is a path, ``ops@example.com`` has an ``@``.
    """
    if len(value) < MIN_CREDENTIAL_LENGTH or not _TOKEN_SHAPE.fullmatch(value):
        return False
    if value.startswith(("/", "./", "../")) or _DOTTED_NAME.fullmatch(value):
        return False
    return len(_LETTER_DIGIT.findall(value)) >= _MIN_LETTER_DIGIT_MIXES


def url_credentials(text: str) -> list[str]:
    """The credentials inside URLs in ``text`` worth redacting on their own (see module doc).

    For each ``scheme://user:password@``: the password (and its percent-decoded form)
    when it could not be an ordinary word or number; for ``scheme://token@``: the token.
    """
    found: list[str] = []
    if not _may_hold_url(text):
        return found
    for match in _URL_USERINFO.finditer(text):
        password = match["password"]
        if password is None:
            if looks_like_credential(match["user"]):
                found.append(match["user"])
            continue
        for form in dict.fromkeys((password, unquote(password))):
            if _lone_password(form):
                found.append(form)
    return found


def environment_secrets(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(name, value)`` pairs to redact from an environment.

    Values of secret-looking names (at least six characters), and the credentials of
    URLs in any variable (``DATABASE_URL``). Other values are settings the log needs:
    paths, hosts, flags.
    """
    found: list[tuple[str, str]] = []
    for name, value in environ.items():
        if looks_secret(name):
            found.extend((name, form) for form in _forms(value) if len(form) >= MIN_SECRET_LENGTH)
        found.extend((name, credential) for credential in url_credentials(value))
    return found


def dotenv_secrets(
    values: Mapping[str, str | None], *, template: bool = False
) -> list[tuple[str, str]]:
    """``(name, value)`` pairs to redact from one ``.env`` file's values.

    As `environment_secrets`, plus every value shaped like a credential whatever its
    name (`looks_like_credential`): a ``.env`` file exists to hold secrets, under names
    no rule can guess (``STRIPE_PK``, ``GITHUB_PAT``). ``template=True`` (``.env.example``)
    drops the name rule: a template's values under secret names are placeholders
    (``changeme``) whose redaction would only garble the log.
    """
    found: list[tuple[str, str]] = []
    for name, value in values.items():
        if value is None:
            continue
        for form in _forms(value):
            named = not template and looks_secret(name) and len(form) >= MIN_SECRET_LENGTH
            if named or looks_like_credential(form):
                found.append((name, form))
        found.extend((name, credential) for credential in url_credentials(value))
    return found


@dataclass(frozen=True, slots=True)
class Redactor:
    """Replaces held values and URL credentials in text and JSON data (module doc).

    ``secrets`` is normalised on construction: empty values dropped, each value kept
    once under the first name given for it, longest first.
    """

    secrets: tuple[tuple[str, str], ...] = ()  # (name, value)
    _names: dict[str, str] = field(init=False, repr=False, compare=False)
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _escaped: bool = field(init=False, repr=False, compare=False)  # a value JSON would escape

    def __post_init__(self) -> None:
        names: dict[str, str] = {}
        for name, value in self.secrets:
            if value and value not in names:
                names[value] = name
        ordered = sorted(names.items(), key=lambda item: len(item[0]), reverse=True)
        object.__setattr__(self, "secrets", tuple((name, value) for value, name in ordered))
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_patterns", _compile_values([value for value, _ in ordered]))
        escaped = any(_JSON_ESCAPED.search(value) for value in names)
        object.__setattr__(self, "_escaped", escaped)

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> Redactor:
        """A redactor for the secrets of one environment (`environment_secrets`)."""
        return cls(tuple(environment_secrets(env)))

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], extra: Iterable[tuple[str, str]] = ()
    ) -> Redactor:
        """The environment's secrets plus ``extra`` pairs taken as given (``.env`` values)."""
        return cls((*environment_secrets(environ), *extra))

    def with_secrets(self, pairs: Iterable[tuple[str, str]]) -> Redactor:
        """This redactor plus ``pairs``; itself when they add no new value."""
        new = [(name, value) for name, value in pairs if value and value not in self._names]
        return Redactor((*self.secrets, *new)) if new else self

    def might_hold(self, json_text: str) -> bool:
        """False only when ``json_text`` (JSON as ``json.dumps(ensure_ascii=False)`` writes
        it) surely holds no secret, so its data need not be walked: no URL, no held value.

        A value JSON would escape (a quote, a backslash, a control character) cannot be
        looked for in the text, so holding one makes the answer always True.
        """
        if self._escaped or _may_hold_url(json_text):
            return True
        return any(pattern.search(json_text) for pattern in self._patterns)

    def scrub_text(self, text: str) -> str:
        """``text`` with URL credentials and every held value replaced (one pass each)."""
        if _may_hold_url(text):
            text = _URL_USERINFO.sub(_redact_userinfo, text)
        held = self._held(text)
        if not held:
            return text
        parts: list[str] = []
        done = 0  # where the text not yet copied starts
        for start, end in held:
            parts.append(text[done:start])
            parts.append(f"[redacted:{self._names[text[start:end]]}]")
            done = end
        parts.append(text[done:])
        return "".join(parts)

    def scrub(self, value: Any) -> Any:
        """``value`` (JSON data, keys included) with every secret replaced.

        Strings, dicts and lists without a secret come back as the same objects.
        """
        if isinstance(value, str):
            return self.scrub_text(value)
        if isinstance(value, dict):
            scrubbed: dict[Any, Any] = {}
            changed = False
            for key, item in value.items():
                new_key, new_item = self.scrub(key), self.scrub(item)
                changed = changed or new_key is not key or new_item is not item
                scrubbed[new_key] = new_item
            return scrubbed if changed else value
        if isinstance(value, list | tuple):
            items = [self.scrub(item) for item in value]
            same = all(new is old for new, old in zip(items, value, strict=True))
            return value if same and isinstance(value, list) else items
        return value

    def secrets_in(self, text: str) -> tuple[str, ...]:
        """What ``text`` holds, by name, never by value: held values' variable names, and
        `URL_CREDENTIAL` for a credential inside a URL. In order of first appearance."""
        found: dict[str, None] = {}
        if _may_hold_url(text):
            for match in _URL_USERINFO.finditer(text):
                if _redact_userinfo(match) != match[0]:
                    found[URL_CREDENTIAL] = None
        for start, end in self._held(text):
            found[self._names[text[start:end]]] = None
        return tuple(found)

    def _held(self, text: str) -> list[tuple[int, int]]:
        """Where held values lie in ``text``: ``(start, end)`` of the longest value starting
        at each place, leaving out those inside an earlier one, in order.

        Values may overlap (``abcd`` and ``cdef`` in ``abcdef``): each is then redacted,
        the later from where the earlier ends, so no part of either stays on record. The
        answer is the same however the values are split among the compiled patterns.
        """
        longest: dict[int, int] = {}
        for pattern in self._patterns:
            for match in pattern.finditer(text):  # zero-width: every start, overlaps too
                start, end = match.span(1)
                if end > longest.get(start, start):
                    longest[start] = end
        held: list[tuple[int, int]] = []
        reached = 0  # where the held values found so far end
        for start in sorted(longest):
            end = longest[start]
            if end <= reached:
                continue  # inside a value already held
            held.append((start, end))
            reached = end
        return held


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables whose names look secret or whose values hold a
    URL's credentials (for child processes)."""
    return {
        name: value
        for name, value in environ.items()
        if not looks_secret(name) and not _holds_url_credential(value)
    }


# --- URL credentials ---------------------------------------------------------------------


_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _may_hold_url(text: str) -> bool:
    return "://" in text or ":\\/\\/" in text


def _redact_userinfo(match: re.Match[str]) -> str:
    """The replacement for one ``://userinfo@``: its secret part redacted, or unchanged."""
    user, password = match["user"], match["password"]
    if password is not None:
        if not password or password.startswith("[redacted"):
            return match[0]
        return f"{match['sep']}{user}:{REDACTED}@"
    if looks_like_credential(user):
        return f"{match['sep']}{REDACTED}@"
    return match[0]


def _holds_url_credential(value: str) -> bool:
    return _may_hold_url(value) and any(
        _redact_userinfo(match) != match[0] for match in _URL_USERINFO.finditer(value)
    )


def _lone_password(value: str) -> bool:
    """True when a URL's password is safe to redact wherever it appears alone."""
    has_letter = any(c.isalpha() for c in value)
    return len(value) >= MIN_LONE_PASSWORD_LENGTH and has_letter and not value.isalpha()


def _forms(value: str) -> list[str]:
    """The value as given and trimmed of surrounding whitespace (each once)."""
    return list(dict.fromkeys((value, value.strip())))


# --- one expression for many values ------------------------------------------------------


def _compile_values(values: list[str]) -> tuple[re.Pattern[str], ...]:
    """Trie-shaped patterns matching every value (longest at each position).

    One pattern unless the trie nests deeper than the regex compiler can take
    (hundreds of values each a prefix of the next): then halves, recursively.
    """
    if not values:
        return ()
    trie = _trie(values)
    if len(values) > 1 and _nesting(trie) > _MAX_NESTING:
        half = len(values) // 2
        return _compile_values(values[:half]) + _compile_values(values[half:])
    return (re.compile(f"(?=({_source(trie)}))"),)  # a lookahead: overlapping values too


def _trie(values: list[str]) -> _Trie:
    root: _Trie = {}
    for value in values:
        node = root
        for char in value:
            node = node.setdefault(char, {})
        node[_END] = {}
    return root


def _nesting(root: _Trie) -> int:
    """How deeply `_source` will nest groups for this trie (computed without recursion)."""
    deepest = 0
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        branches = [key for key in node if key != _END]
        grouped = len(branches) > 1 or (_END in node and bool(branches))
        here = depth + grouped
        deepest = max(deepest, here)
        stack.extend((node[key], here) for key in branches)
    return deepest


def _source(node: _Trie) -> str:
    """The regex for the values below ``node``; a value ending here makes the rest optional
    (greedy, so the longest value wins)."""
    alternatives = []
    for key in sorted(k for k in node if k != _END):
        text, child = key, node[key]
        while len(child) == 1 and _END not in child:  # a chain: one literal run
            ((next_key, child),) = child.items()
            text += next_key
        alternatives.append(re.escape(text) + _source(child))
    if not alternatives:
        return ""
    if _END in node:
        return "(?:" + "|".join(alternatives) + ")?"
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + "|".join(alternatives) + ")"


class SecretSource(Protocol):
    """Where the driver's redactor learns secret values beyond the environment's."""

    def refresh(self, current: Redactor) -> Redactor:
        """``current`` plus what the ``.env`` files hold now (nothing is forgotten)."""
        ...

    def learn(self, current: Redactor, path: str, text: str) -> Redactor:
        """``current`` plus the values in ``text``, about to be written to secret ``path``."""
        ...
