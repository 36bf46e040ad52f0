"""Redaction rules: URL credentials, `.env` values by name and by shape, held values, cost."""

from __future__ import annotations

import json
import random
import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.core.redact import (
    URL_CREDENTIAL,
    Redactor,
    dotenv_secrets,
    environment_secrets,
    looks_like_credential,
    url_credentials,
    without_secrets,
)

EMPTY = Redactor()

# --- credentials inside URLs -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "postgres://user:S3cretPass@db.example.com/app",
            "postgres://user:[redacted]@db.example.com/app",
        ),
        (
            "postgresql://app_user:pw-with:colons@db.internal:5432/app?sslmode=require",
            "postgresql://app_user:[redacted]@db.internal:5432/app?sslmode=require",
        ),
        (
            "https://admin:hunter22@example.com:8443/path/to?q=1&r=2#frag",
            "https://admin:[redacted]@example.com:8443/path/to?q=1&r=2#frag",
        ),
        ("redis://:p4ssw0rd@cache:6379/0", "redis://:[redacted]@cache:6379/0"),
        (
            "postgresql://u:pw@[2001:db8::1]:5432/db?connect_timeout=3",
            "postgresql://u:[redacted]@[2001:db8::1]:5432/db?connect_timeout=3",
        ),
        ("mysql://root:p@ss:w0rd@localhost/x", "mysql://root:[redacted]@localhost/x"),
        ("amqp://guest:gue%40st@rabbit/vhost", "amqp://guest:[redacted]@rabbit/vhost"),
        (
            'DATABASE_URL="postgres://u:pw12345@h/db" and more',
            'DATABASE_URL="postgres://u:[redacted]@h/db" and more',
        ),
        (
            "clone https://x-access-token:ghs_abc123DEF456@github.com/o/r.git now",
            "clone https://x-access-token:[redacted]@github.com/o/r.git now",
        ),
        (
            "https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r.git",
            "https://[redacted]@github.com/o/r.git",
        ),
        (
            '{"url": "postgres:\\/\\/u:pw12345@h\\/db"}',  # JSON with escaped slashes
            '{"url": "postgres:\\/\\/u:[redacted]@h\\/db"}',
        ),
        (
            "two: http://a:one1one@h1/ and ftp://b:two2two@h2/x",
            "two: http://a:[redacted]@h1/ and ftp://b:[redacted]@h2/x",
        ),
    ],
)
def test_a_url_password_is_redacted_keeping_scheme_user_and_host(text: str, expected: str) -> None:
    assert EMPTY.scrub_text(text) == expected
    assert EMPTY.secrets_in(text) == (URL_CREDENTIAL,)


@pytest.mark.parametrize(
    "text",
    [
        "write to ops@example.com or first.last+tag@sub.example.co.uk",
        "mailto:ops@example.com",
        "ssh://git@github.com/org/repo.git",
        "git@github.com:org/repo.git",
        "https://user@example.com/",  # an ordinary user name, no password
        "http://[::1]:8080/a@b",
        "https://example.com/users/@me",
        "http://host:8080/path?email=a@b.com",
        "https://example.com:8443/#a@b",
        "postgres://db.internal:5432/app",
        "ftp://user:@host/",  # an empty password hides nothing
        "already clean: postgres://u:[redacted]@h/db",
    ],
)
def test_ordinary_urls_and_emails_are_left_alone(text: str) -> None:
    assert EMPTY.scrub_text(text) == text
    assert EMPTY.secrets_in(text) == ()


@settings(max_examples=200, deadline=None)
@given(
    scheme=st.sampled_from(["postgres", "https", "redis", "mongodb+srv", "amqp"]),
    user=st.from_regex(r"[A-Za-z0-9._\-]{0,12}", fullmatch=True),
    password=st.text(
        alphabet=st.characters(
            codec="utf-8", exclude_characters="/\\?#\"'<>", exclude_categories=("Z", "C")
        ),
        min_size=1,
        max_size=30,
    ).filter(lambda p: not p.startswith("[redacted")),
    host=st.from_regex(r"[a-z][a-z0-9\-]{0,10}(\.[a-z]{2,6}){0,2}(:[0-9]{2,5})?", fullmatch=True),
    rest=st.from_regex(r"(/[A-Za-z0-9_\-]{0,8}){0,3}(\?[a-z]=[0-9a-z@]{0,5})?", fullmatch=True),
)
def test_any_url_password_is_replaced_and_nothing_else_changes(
    scheme: str, user: str, password: str, host: str, rest: str
) -> None:
    scrubbed = EMPTY.scrub_text(f"see {scheme}://{user}:{password}@{host}{rest} now")
    assert scrubbed == f"see {scheme}://{user}:[redacted]@{host}{rest} now"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.emails(), min_size=1, max_size=5))
def test_emails_are_never_touched(emails: list[str]) -> None:
    text = "contact " + ", ".join(emails)
    assert EMPTY.scrub_text(text) == text


def test_url_credentials_gives_lone_passwords_worth_redacting_on_their_own() -> None:
    assert url_credentials("postgres://u:S3cretPass@h/db") == ["S3cretPass"]
    assert url_credentials("amqp://u:gue%40st99@h/") == ["gue%40st99", "gue@st99"]
    # an ordinary word or number would garble the log wherever it appears: URL only
    assert url_credentials("postgres://postgres:postgres@localhost/db") == []
    assert url_credentials("redis://:12345678@h") == []
    token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    assert url_credentials(f"https://{token}@github.com/o/r") == [token]


# --- which values are secrets ------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "sk-live-7f3a9c1e5b2d4f60",
        "7f3a9c1e5b2d4f607f3a9c1e5b2d4f60",  # hex
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCY2EXAMPLEKEY",  # base64-ish
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",  # JWT
        "123e4567-e89b-12d3-a456-426614174000",  # a UUID used as a token
        "pk_live_51H8xKqA2b3C4d5E6f7G8h9",
    ],
)
def test_generated_tokens_look_like_credentials(value: str) -> None:
    assert looks_like_credential(value)


@pytest.mark.parametrize(
    "value",
    [
        "production",
        "localhost",
        "8080",
        "true",
        "invoice_service_v2",  # a name with a version: one letter/digit mix
        "release-2024-candidate",
        "db-01.internal.example.com",  # a dotted lower-case name
        "python3.11.4-slim-bookworm",
        "/var/lib/app2/data3/cache4",  # a path
        "ops2024@example.com",
        "https://example.com/api/v2",
        "S3cretPass",  # too short to tell from a word by shape alone
    ],
)
def test_ordinary_settings_do_not_look_like_credentials(value: str) -> None:
    assert not looks_like_credential(value)


def test_dotenv_values_are_secret_by_name_or_by_shape() -> None:
    values: dict[str, str | None] = {
        "OPENAI_API_KEY": "sk-abcdef",  # secret name
        "DB_PASSWORD": "hunter2!",  # secret name, any shape
        "UPSTREAM_ID": "a9F3kL20xQ7mZ15pW4",  # ordinary name, credential shape
        "DATABASE_URL": "postgres://app:S3cretPass@db/app",  # a URL's password
        "ENVIRONMENT": "production",
        "HOST": "localhost",
        "PORT": "8080",
        "APP_NAME": "invoice_service_v2",
        "SHORT_TOKEN": "abc",  # too short: would redact ordinary words
        "EMPTY": None,
    }
    assert sorted(dotenv_secrets(values)) == [
        ("DATABASE_URL", "S3cretPass"),
        ("DB_PASSWORD", "hunter2!"),
        ("OPENAI_API_KEY", "sk-abcdef"),
        ("UPSTREAM_ID", "a9F3kL20xQ7mZ15pW4"),
    ]


def test_a_template_keeps_only_values_shaped_like_credentials() -> None:
    values: dict[str, str | None] = {
        "API_KEY": "changeme",  # a placeholder: redacting it would garble the log
        "LEAKED_TOKEN": "sk-live-7f3a9c1e5b2d4f60",  # a real one committed by mistake
    }
    assert dotenv_secrets(values, template=True) == [("LEAKED_TOKEN", "sk-live-7f3a9c1e5b2d4f60")]


def test_environment_secrets_go_by_name_and_url_only() -> None:
    env = {
        "GITHUB_TOKEN": "ghs_abcdef123456",
        "DATABASE_URL": "postgres://app:S3cretPass@db/app",
        "PWD": "/home/user/project2024abc123def",
        "SESSION_ID": "a9F3kL20xQ7mZ15pW4",  # shape alone does not count in an environment
        "API_KEY": "  padded-value  ",
    }
    assert sorted(environment_secrets(env)) == [
        ("API_KEY", "  padded-value  "),
        ("API_KEY", "padded-value"),
        ("DATABASE_URL", "S3cretPass"),
        ("GITHUB_TOKEN", "ghs_abcdef123456"),
    ]


def test_without_secrets_drops_secret_names_and_url_credentials() -> None:
    env = {
        "PATH": "/usr/bin",
        "OPENAI_API_KEY": "sk-x",
        "DATABASE_URL": "postgres://app:S3cretPass@db/app",
        "PUBLIC_URL": "https://example.com/app",
    }
    assert without_secrets(env) == {"PATH": "/usr/bin", "PUBLIC_URL": "https://example.com/app"}


# --- the redactor ------------------------------------------------------------------------


def test_held_values_are_replaced_by_their_variable_names() -> None:
    redactor = Redactor.from_environment(
        {"OPENAI_API_KEY": "sk-live-7f3a9c1e5b2d4f60", "HOME": "/home/u"},
        [("SERVICE_TOKEN", "ws-dotenv-Qz81mK42")],
    )
    text = "key=sk-live-7f3a9c1e5b2d4f60 token ws-dotenv-Qz81mK42 home /home/u"
    assert redactor.scrub_text(text) == (
        "key=[redacted:OPENAI_API_KEY] token [redacted:SERVICE_TOKEN] home /home/u"
    )
    assert redactor.secrets_in(text) == ("OPENAI_API_KEY", "SERVICE_TOKEN")


def test_the_longest_held_value_wins_and_the_first_name_of_a_value_is_kept() -> None:
    redactor = Redactor((("SHORT", "abc123def"), ("LONG", "abc123def456"), ("AGAIN", "abc123def")))
    assert redactor.secrets == (("LONG", "abc123def456"), ("SHORT", "abc123def"))
    assert redactor.scrub_text("abc123def456 abc123def") == "[redacted:LONG] [redacted:SHORT]"


def test_empty_values_are_never_held() -> None:
    assert Redactor((("X_TOKEN", ""),)).secrets == ()
    assert Redactor.from_mapping({"X_TOKEN": ""}).scrub_text("text") == "text"


def test_with_secrets_adds_only_new_values() -> None:
    first = Redactor((("A_TOKEN", "alpha-123456"),))
    assert first.with_secrets([("A_TOKEN", "alpha-123456")]) is first
    more = first.with_secrets([("B_TOKEN", "bravo-654321")])
    assert more.scrub_text("alpha-123456 bravo-654321") == "[redacted:A_TOKEN] [redacted:B_TOKEN]"


def test_scrub_walks_json_keys_and_values_and_reuses_clean_objects() -> None:
    redactor = Redactor((("API_TOKEN", "tok-123456789"),))
    clean = {"a": [1, "plain", {"b": None}], "c": True}
    assert redactor.scrub(clean) is clean
    dirty = {"args": ["echo", "tok-123456789"], "changed": {"out/tok-123456789.txt": "h"}}
    assert redactor.scrub(dirty) == {
        "args": ["echo", "[redacted:API_TOKEN]"],
        "changed": {"out/[redacted:API_TOKEN].txt": "h"},
    }
    assert redactor.scrub(("x", "tok-123456789")) == ["x", "[redacted:API_TOKEN]"]


def test_scrubbing_twice_changes_nothing_more() -> None:
    redactor = Redactor((("API_TOKEN", "tok-123456789"),))
    text = "tok-123456789 postgres://u:pw-1234567@h/db https://ghp_16C7e42F292c6912E7710c8@x"
    once = redactor.scrub_text(text)
    assert redactor.scrub_text(once) == once


def test_a_held_value_redacted_inside_a_url_keeps_its_name_when_scrubbed_again() -> None:
    # a raw / ends the URL pattern early (module doc), so the held value is what is redacted,
    # by name; scrubbed again (by the same or any redactor) the marker is no credential
    redactor = Redactor((("DB_PASSWORD", "pa/ss-w0rd"),))
    once = redactor.scrub_text("postgres://app:pa/ss-w0rd@db/x")
    assert once == "postgres://app:[redacted:DB_PASSWORD]@db/x"
    for again in (redactor, EMPTY):
        assert again.scrub_text(once) == once
        assert again.secrets_in(once) == ()
    assert without_secrets({"DATABASE_URL": once}) == {"DATABASE_URL": once}


secret_values = st.text(
    alphabet=string.ascii_letters + string.digits + "_-+/=.", min_size=6, max_size=40
).filter(lambda s: any(c.isdigit() for c in s))  # markers hold no digit


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(max_size=200), secret=secret_values, suffix=st.text(max_size=200))
def test_any_text_holding_a_planted_secret_is_scrubbed_of_it(
    prefix: str, secret: str, suffix: str
) -> None:
    redactor = Redactor.from_mapping({"DEPLOY_TOKEN": secret})
    scrubbed = redactor.scrub_text(prefix + secret + suffix + secret)
    assert secret not in scrubbed
    assert json.dumps(secret)[1:-1] not in json.dumps(scrubbed)


@settings(max_examples=100, deadline=None)
@given(
    secrets=st.lists(secret_values, min_size=1, max_size=30, unique=True),
    text=st.text(max_size=100),
    data=st.data(),
)
def test_every_planted_secret_is_scrubbed_among_many(
    secrets: list[str], text: str, data: st.DataObject
) -> None:
    redactor = Redactor(tuple((f"S{i}_TOKEN", s) for i, s in enumerate(secrets)))
    planted = data.draw(st.permutations(secrets))
    scrubbed = redactor.scrub_text(text.join(planted))
    for secret in secrets:
        assert secret not in scrubbed


# --- cost --------------------------------------------------------------------------------


def _token(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))


def test_thousands_of_secrets_over_a_megabyte_stay_fast() -> None:
    rng = random.Random(10)
    secrets = [_token(rng, rng.randint(16, 48)) for _ in range(5_000)]
    redactor = Redactor(tuple((f"V{i}_TOKEN", s) for i, s in enumerate(secrets)))
    words = [_token(rng, rng.randint(2, 12)) for _ in range(130_000)]
    for index in range(0, len(words), 1_000):
        words[index] = secrets[index % len(secrets)]
    text = " ".join(words)
    assert len(text) > 1_000_000
    started = time.perf_counter()
    scrubbed = redactor.scrub_text(text)
    elapsed = time.perf_counter() - started
    assert all(secrets[i % len(secrets)] not in scrubbed for i in range(0, len(words), 1_000))
    # One pass over a trie: about a second at worst on a slow machine; a rescan per
    # secret (5,000 searches of a megabyte) or a plain alternation takes tens of seconds.
    assert elapsed < 5.0


def test_values_that_are_prefixes_of_each_other_still_compile_and_scrub() -> None:
    # Each value a prefix of the next nests the trie 600 deep: split, not a RecursionError.
    chain = ["k7" * n for n in range(3, 603)]
    redactor = Redactor(tuple((f"C{n}_KEY", v) for n, v in enumerate(chain)))
    longest = chain[-1]
    assert redactor.scrub_text(f"<{longest}>") == f"<[redacted:C{len(chain) - 1}_KEY]>"
    assert redactor.scrub_text("<k7k7k7k7>") == "<[redacted:C1_KEY]>"


def test_might_hold_is_false_only_when_the_json_text_surely_holds_no_secret() -> None:
    plain = Redactor((("API_KEY", "sk-live-0123456789abcdef"),))
    assert plain.might_hold('{"output": "sk-live-0123456789abcdef"}')
    assert plain.might_hold('{"url": "postgres://u:pw@host/db"}')
    assert not plain.might_hold('{"output": "nothing to see"}')
    # A value JSON would escape cannot be found in the text: always walk.
    quoted = Redactor((("TOKEN", 'abc"defghijk'),))
    assert quoted.might_hold("{}")


# --- the edges of the credential shape ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "credential"),
    [
        ("a1b2c3d4e5f6g7h8", True),  # exactly 16 characters
        ("a1b2c3d4e5f6g7h", False),  # 15
        ("abcdefghijklmnop1q2", True),  # a letter beside a digit exactly three times
        ("abcdefghijklmnop1q", False),  # twice
        ("a1b2c3d4@example.com", False),  # an @ is not of a token's alphabet
        ("./a1b2c3d4e5f6g7", False),  # relative paths
        ("../a1b2c3d4e5f6g7", False),
    ],
)
def test_the_edges_of_what_looks_like_a_credential(value: str, credential: bool) -> None:
    assert looks_like_credential(value) is credential


def test_every_url_of_a_text_is_searched_for_credentials() -> None:
    text = "https://ghp_a1b2c3d4e5f6g7h8@github.com/x then postgres://u:s3cr3tpass1@db/x"
    assert url_credentials(text) == ["ghp_a1b2c3d4e5f6g7h8", "s3cr3tpass1"]


def test_a_dotenv_variable_without_a_value_does_not_hide_the_ones_after_it() -> None:
    assert dotenv_secrets({"EMPTY": None, "API_KEY": "abcdef"}) == [("API_KEY", "abcdef")]


def test_a_url_naming_only_a_user_is_no_credential_for_a_child_process() -> None:
    environ = {"HOMEPAGE": "https://git@github.com/x", "DB": "postgres://u:s3cr3tpass1@db/x"}
    assert without_secrets(environ) == {"HOMEPAGE": "https://git@github.com/x"}


def test_a_held_value_that_two_longer_ones_continue_leaves_neither_longer_one_in_part() -> None:
    # "tok-9f2e" ends where "tok-9f2eab" and "tok-9f2ecd" branch on: whichever follows,
    # the whole longer value is redacted, not its prefix with the rest left on record.
    redactor = Redactor((("BASE", "tok-9f2e"), ("ALPHA", "tok-9f2eab"), ("BETA", "tok-9f2ecd")))
    text = "1 tok-9f2eab 2 tok-9f2ecd 3 tok-9f2e 4 tok-9f2ezz"
    assert redactor.scrub_text(text) == (
        "1 [redacted:ALPHA] 2 [redacted:BETA] 3 [redacted:BASE] 4 [redacted:BASE]zz"
    )


def test_held_values_are_kept_longest_first() -> None:
    assert Redactor((("A", "zz"), ("B", "aaaa"))).secrets == (("B", "aaaa"), ("A", "zz"))


def test_a_held_value_is_replaced_where_it_starts_first_and_an_overlapping_one_after_it() -> None:
    redactor = Redactor((("C", "cdef"), ("A", "abcd")))
    assert redactor.scrub_text("abcdef") == "[redacted:A][redacted:C]"
    assert redactor.scrub_text("abcd cdef") == "[redacted:A] [redacted:C]"


def test_overlapping_held_values_leave_no_part_of_either_on_record() -> None:
    redactor = Redactor((("A_TOKEN", "hunter22"), ("B_TOKEN", "22SuperSecretValue")))
    text = "login hunter22SuperSecretValue now"
    assert redactor.scrub_text(text) == "login [redacted:A_TOKEN][redacted:B_TOKEN] now"
    assert redactor.secrets_in(text) == ("A_TOKEN", "B_TOKEN")


def test_a_value_inside_a_longer_held_value_is_redacted_with_it() -> None:
    redactor = Redactor((("INNER", "SECRET9"), ("OUTER", "xSECRET9x"), ("TAIL", "ySECRET9")))
    assert redactor.scrub_text("<xSECRET9x>") == "<[redacted:OUTER]>"
    assert redactor.scrub_text("<ySECRET9>") == "<[redacted:TAIL]>"  # inside up to its end
    assert redactor.secrets_in("<xSECRET9x> SECRET9") == ("OUTER", "INNER")


def test_held_values_are_redacted_from_the_very_first_character_of_a_text() -> None:
    redactor = Redactor((("K", "7"), ("LONG_KEY", "k9-secret")))
    assert redactor.scrub_text("7 and 7") == "[redacted:K] and [redacted:K]"
    assert redactor.scrub_text("k9-secret!") == "[redacted:LONG_KEY]!"


def test_values_overlapping_across_split_patterns_are_both_redacted() -> None:
    # 600 prefix-chained values are compiled as several patterns; a value that overlaps
    # the start of a chained one is redacted with it wherever either was compiled.
    chain = ["k7" * n for n in range(3, 603)]
    pairs = (*((f"C{n}_KEY", v) for n, v in enumerate(chain)), ("Z_KEY", "Zk7k7k7"))
    redactor = Redactor(pairs)
    assert redactor.scrub_text("<Zk7k7k7k7k7>") == "<[redacted:Z_KEY][redacted:C2_KEY]>"
    assert redactor.secrets_in("<Zk7k7k7k7k7>") == ("Z_KEY", "C2_KEY")


def test_one_pattern_holds_values_nested_up_to_the_limit_and_deeper_ones_are_halved() -> None:
    # "x", "xx", ... : each value but the longest ends where a longer one goes on, one
    # group per value, so 101 values nest exactly _MAX_NESTING = 100 groups deep.
    at_limit = Redactor(tuple((f"X{k}_KEY", "x" * k) for k in range(1, 102)))
    assert len(at_limit._patterns) == 1
    deeper = Redactor(tuple((f"X{k}_KEY", "x" * k) for k in range(1, 103)))
    assert len(deeper._patterns) == 2
    assert (
        deeper.scrub_text("<" + "x" * 102 + "> <x>") == "<[redacted:X102_KEY]> <[redacted:X1_KEY]>"
    )
    chain = Redactor(tuple((f"C{n}_KEY", "k7" * n) for n in range(3, 603)))
    assert len(chain._patterns) == 8  # halved: 600 values, 300, 150, then 8 of 75


def test_values_each_a_one_character_extension_of_the_last_still_compile_and_scrub() -> None:
    redactor = Redactor(tuple((f"X{k}_KEY", "x" * k) for k in range(1, 601)))
    assert redactor.scrub_text("<" + "x" * 600 + ">") == "<[redacted:X600_KEY]>"
    assert redactor.scrub_text("<xxx>") == "<[redacted:X3_KEY]>"


def test_values_branching_in_two_at_every_character_still_compile_and_scrub() -> None:
    # "z", "qz", "qqz", ...: every node of the trie has two branches, 600 deep.
    redactor = Redactor(tuple((f"Q{i}_KEY", "q" * i + "z") for i in range(600)))
    assert redactor.scrub_text("<" + "q" * 599 + "z>") == "<[redacted:Q599_KEY]>"
    assert redactor.scrub_text("<qqz>") == "<[redacted:Q2_KEY]>"
