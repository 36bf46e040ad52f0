"""A POSIX shell string read as the simple commands it runs, without running anything.

``read_script(text)`` splits the text at ``;``, ``&&``, ``||``, ``|``, ``|&``,
``&`` and newlines, removes quotes and backslashes the way the shell does, drops
redirections (``>f``, ``2>&1``, ``<f``), comments, reserved words (``if``,
``then``, ``do``, ``{`` ...) and loop headers, and separates the leading
``NAME=value`` assignments of each command.

What the shell would compute before running anything makes the script *opaque*:
command substitution (``$(...)`` and backquotes), process substitution
(``<(...)``), parentheses (subshells, function definitions, arithmetic), here-
documents and unbalanced quotes; so do ``$'...'``, ``$"..."`` and a ``'`` inside a
double-quoted ``${...}``, which shells read differently (bash's reading is taken, and
dash's too, as a nested script, when it splits the text elsewhere). Their text is
kept raw in the word (so a computed command name still looks computed: it holds ``$``
or a backquote), and the bodies of substitutions and subshells are returned as
``nested`` scripts so the commands inside them can be read too. Words the shell
expands when it runs them (a parameter, an unquoted file-name pattern, braces, a leading
``~``) are named in ``ShellCommand.expanded``: the caller cannot know what they become.
Nothing here raises: any text reads as some script, at worst an opaque one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RESERVED_PREFIX = frozenset(
    ("!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "esac")
) | {"always"}  # zsh: ``{ ...; } always { ...; }``
_HEADERS = frozenset(("for", "select", "case"))  # ``for x in a b`` runs no command itself
# run the command after them: bash's ``coproc [NAME]``, zsh's precommand modifiers and
# ``repeat N`` (``builtin``, ``command``, ``exec`` are read as wrappers)
_PRECOMMAND = frozenset(("coproc", "noglob", "nocorrect", "-", "repeat"))
_PREFIX = _RESERVED_PREFIX | _PRECOMMAND
_DO = frozenset(("do",))
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
_Word = tuple[str, int, bool]  # text, length of its unquoted prefix, expanded by the shell
_CONTROL = ("&&", "||", ";;", ";&", "|&", ";", "|", "&")
_BRACES = re.compile(r"\{([^{}]*)\}")  # innermost {...}: each character is scanned once
_REDIRECTS = ("<<<", "<<-", "<<", "<>", "<&", "&>>", "&>", ">>", ">&", ">|", "<", ">")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellCommand:
    """One simple command: its leading assignments, then its words (quotes removed)."""

    assignments: tuple[str, ...]
    words: tuple[str, ...]
    # indices of the words the shell expands before running them: a parameter ($F, ${F},
    # "$@"), an unquoted file-name pattern (*, ?, [...]), braces ({a,b}, {1..3}), a
    # leading ~. What such a word becomes is known only at run time.
    expanded: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellScript:
    """The simple commands of a shell string, in order, and what could not be read."""

    commands: tuple[ShellCommand, ...]
    nested: tuple[str, ...] = ()  # bodies of $(...), `...`, <(...), (...): scripts of their own
    opaque: tuple[str, ...] = ()  # one short reason per construct the shell would compute


def read_script(text: str) -> ShellScript:
    """Read ``text`` as ``sh -c`` would split it; see the module docstring. Never raises."""
    scanner = _Scanner(text)
    scanner.scan()
    nested = scanner.nested
    if scanner.dash_differs:  # also the commands dash would run: see ``_Scanner.escapes``
        parts, at = [], 0
        for start in sorted(set(scanner.escapes)):
            parts += [text[at:start], "\\"]
            at = start
        nested = [*nested, "".join([*parts, text[at:]])]
    return ShellScript(
        commands=tuple(scanner.commands()),
        nested=tuple(nested),
        opaque=tuple(scanner.opaque),
    )


def closing(text: str, start: int, pair: str = "()", quotes: str = "'\"`") -> int | None:
    """Index of the bracket closing the one at ``start`` (``quotes`` skipped), or None."""
    opening, close = pair[0], pair[1]
    depth, j, n = 0, start, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c in quotes:
            end = _quote_end(text, j)
            if end is None:
                return None
            j = end + 1
            continue
        if c == opening:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return None


def _quote_end(text: str, start: int) -> int | None:
    """Index of the quote closing the one at ``start`` (backslash escapes honoured but in '')."""
    quote, j = text[start], start + 1
    while j < len(text):
        if text[j] == "\\" and quote != "'":
            j += 2
            continue
        if text[j] == quote:
            return j
        j += 1
    return None


class _Scanner:
    """A character-level pass producing word and operator tokens; see ``read_script``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        # (kind "word" | "op", text, length of the word's unquoted prefix, expanded)
        self.tokens: list[tuple[str, str, int, bool]] = []
        self.nested: list[str] = []
        self.opaque: list[str] = []
        self.word: list[str] = []
        self.length = 0  # characters in ``word``
        self.started = False  # a word is being built (``''`` is a word too)
        self.plain: int | None = None  # where the first quoted or escaped part begins
        self.unquoted: list[str] = []  # the word's characters outside quotes and escapes
        self.expands = False  # the word holds a parameter expansion ($F, ${F}, $@)
        self.redirect: str | None = None  # what the next word is: "target" or "heredoc[-]"
        self.heredocs: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs)
        # Where a backslash makes bash read the text as dash does: before each ``$'``
        # (dash: ``$`` then '...'), before each ``'`` of a ``"${...'...}"`` (dash: no quote)
        self.escapes: list[int] = []
        self.dash_differs = False  # dash splits the text elsewhere: read its way too
        self.in_double = False  # inside "...": ``dollar`` reads ``${`` for dash too

    def flag(self, reason: str) -> None:
        if reason not in self.opaque:
            self.opaque.append(reason)

    def add(self, text: str, *, quoted: bool = False) -> None:
        if quoted and self.plain is None:
            self.plain = self.length
        self.word.append(text)
        self.length += len(text)
        self.started = True

    def take_word(self) -> tuple[str, int, bool]:
        text, plain = "".join(self.word), self.plain
        bare = "".join(self.unquoted)
        expanded = self.expands or _expands(bare) or bare[:1] == "~" == text[:1]
        self.word, self.length, self.started, self.plain = [], 0, False, None
        self.unquoted, self.expands = [], False
        return text, len(text) if plain is None else plain, expanded

    def flush(self) -> None:
        if not self.started:
            return
        text, plain, expanded = self.take_word()
        if self.redirect is None:
            self.tokens.append(("word", text, plain, expanded))
        elif self.redirect.startswith("heredoc"):
            self.heredocs.append((text, self.redirect == "heredoc-"))
        self.redirect = None  # a redirection's target is not an argument

    def op(self, text: str) -> None:
        self.flush()
        self.redirect = None
        self.tokens.append(("op", text, 0, False))

    def scan(self) -> None:
        text, n = self.text, len(self.text)
        while self.i < n:
            c = text[self.i]
            if c in " \t":
                self.flush()
                self.i += 1
            elif c == "\n":
                self.op(";")
                self.i += 1
                self.skip_heredoc_bodies()
            elif c == "#" and not self.started:
                end = text.find("\n", self.i)
                self.i = n if end < 0 else end
            elif c == "\\":
                if self.i + 1 < n and text[self.i + 1] != "\n":
                    self.add(text[self.i + 1], quoted=True)
                elif self.i + 1 >= n:
                    self.add("\\")
                self.i += 2  # ``\`` newline: a line continuation
            elif c in "'\"":
                self.quote(c)
            elif c == "`":
                self.backquote()
            elif text.startswith("$'", self.i):
                self.dollar_single_quote()
            elif text.startswith('$"', self.i):
                self.flag('locale translation $"..."')
                self.i += 1  # bash reads the double-quoted string (translated: as is in C)
            elif c == "$":
                self.dollar()
            elif c in "<>" and text.startswith("(", self.i + 1):
                self.substitution(self.i + 1, "process substitution <(...)")
            elif c in "<>" or text.startswith("&>", self.i):
                self.redirection()
            elif c in "&|;":
                self.control()
            elif c == "(":
                self.parenthesis()
            elif c == ")":
                self.flag("unbalanced parentheses")
                self.op(";")
                self.i += 1
            else:
                self.add(c)
                self.unquoted.append(c)
                self.i += 1
        self.flush()

    def quote(self, quote: str) -> None:
        text, n = self.text, len(self.text)
        if quote == "'":
            end = text.find("'", self.i + 1)
            if end < 0:
                self.flag("unbalanced quotes")
                self.add(text[self.i + 1 :], quoted=True)
                self.i = n
            else:
                self.add(text[self.i + 1 : end], quoted=True)
                self.i = end + 1
            return
        self.add("", quoted=True)
        self.i += 1
        self.in_double = True
        while self.i < n:
            c = text[self.i]
            if c == '"':
                self.i += 1
                self.in_double = False
                return
            if c == "\\" and self.i + 1 < n and text[self.i + 1] in '$`"\\\n':
                if text[self.i + 1] != "\n":
                    self.add(text[self.i + 1])
                self.i += 2
            elif c == "`":
                self.backquote()
            elif c == "$":
                self.dollar()
            else:
                self.add(c)
                self.i += 1
        self.flag("unbalanced quotes")  # and the scan ends: in_double is not read again

    def backquote(self) -> None:
        text, n = self.text, len(self.text)
        body: list[str] = []
        j = self.i + 1
        while j < n and text[j] != "`":
            if text[j] == "\\" and j + 1 < n and text[j + 1] in "`\\$":
                j += 1
            body.append(text[j])
            j += 1
        if j >= n:
            self.flag("unbalanced backquote")
            self.add(text[self.i :])
            self.i = n
            return
        self.flag("command substitution `...`")
        self.nested.append("".join(body))
        self.add(text[self.i : j + 1])
        self.i = j + 1

    def dollar_single_quote(self) -> None:
        """``$'...'`` as bash, zsh, ksh and POSIX.1-2024 read it: a backslash escapes the
        next character, a quote too. dash reads ``$`` and a plain '...' (read_script also
        reads the text that way when the quote would end elsewhere). Without escapes the
        word is the text; with them it stays raw, so it holds ``$`` (computed)."""
        text, n, start = self.text, len(self.text), self.i
        self.flag("dollar-single-quotes $'...' (shells read them differently)")
        self.escapes.append(start)
        j = start + 2
        while j < n and text[j] != "'":
            j += 2 if text[j] == "\\" else 1
        if j >= n:
            self.dash_differs = self.dash_differs or "'" in text[start + 2 :]
            self.flag("unbalanced quotes")
            self.add(text[start:], quoted=True)
            self.i = n
            return
        body = text[start + 2 : j]
        self.dash_differs = self.dash_differs or "'" in body
        self.add(text[start : j + 1] if "\\" in body else body, quoted=True)
        self.i = j + 1

    def dollar(self) -> None:
        text, i = self.text, self.i
        if text.startswith("$((", i):
            self.flag("arithmetic expansion $((...))")
            end, inner = closing(text, i + 1), closing(text, i + 2)
            if end is not None and inner is not None and inner + 1 != end:
                # bash: ``$((a) b)`` (no ``))``) substitutes the output of a subshell
                self.flag("command substitution $(...)")
                self.nested.append(text[i + 2 : end])
            self.raw_until(end)
        elif text.startswith("$(", i):
            self.substitution(i + 1, "command substitution $(...)")
        elif text.startswith("${", i):
            self.expands = True
            end = closing(text, i + 1, "{}")
            dash = closing(text, i + 1, "{}", '"`') if self.in_double else end
            if dash != end:  # in "${...}", dash reads ' as a character, bash as a quote
                self.flag('a single quote inside "${...}" (shells read it differently)')
                self.dash_differs = True
                stop = len(text) if dash is None else dash
                self.escapes += [k for k in range(i, stop) if text[k] == "'"]
            if end is not None and ("$(" in text[i:end] or "`" in text[i:end]):
                self.flag("command substitution inside ${...}")
            self.raw_until(end)
        else:
            # ``$NAME``, ``$1``, ``$@`` ... expand; a ``$`` before anything else is a ``$``
            following = text[i + 1 : i + 2]
            self.expands = self.expands or (
                following != "" and (following.isalnum() or following in "_@*#?-$!")
            )
            self.add("$")
            self.i += 1

    def substitution(self, open_at: int, reason: str) -> None:
        """``$(...)``, ``<(...)``, ``>(...)`` starting at ``self.i``; ``(`` at ``open_at``."""
        end = closing(self.text, open_at)
        if end is not None:
            self.flag(reason)
            self.nested.append(self.text[open_at + 1 : end])
        self.raw_until(end)

    def raw_until(self, end: int | None) -> None:
        """Keep ``text[i..end]`` in the word as written; None: unbalanced, to the end."""
        if end is None:
            self.flag("unbalanced parentheses or braces")
            end = len(self.text) - 1
        self.add(self.text[self.i : end + 1])
        self.i = end + 1

    def redirection(self) -> None:
        if self.started and self.plain is None and "".join(self.word).isdigit():
            self.take_word()  # ``2>``: the digits name a descriptor, not an argument
        self.flush()
        text = self.text
        operator = next(r for r in (*_REDIRECTS, text[self.i]) if text.startswith(r, self.i))
        self.i += len(operator)
        if operator in ("<<", "<<-"):
            self.flag("here-document")
            self.redirect = "heredoc-" if operator == "<<-" else "heredoc"
        else:
            self.redirect = "target"

    def control(self) -> None:
        operator = next(o for o in _CONTROL if self.text.startswith(o, self.i))
        self.op(operator)
        self.i += len(operator)

    def parenthesis(self) -> None:
        text = self.text
        end = closing(text, self.i)
        if text.startswith("((", self.i):
            self.flag("arithmetic command ((...))")
        else:
            self.flag("parentheses (a subshell or function definition)")
        if end is not None:  # read ``((...))`` too: subshells in dash, and in bash without ``))``
            self.nested.append(text[self.i + 1 : end])
        self.op(";")
        if end is None:
            self.flag("unbalanced parentheses")
            self.i = len(text)
        else:
            self.i = end + 1

    def skip_heredoc_bodies(self) -> None:
        text, n = self.text, len(self.text)
        for delimiter, strip_tabs in self.heredocs:
            while self.i < n:
                end = text.find("\n", self.i)
                line = text[self.i : n if end < 0 else end]
                self.i = n if end < 0 else end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.heredocs = []

    def commands(self) -> list[ShellCommand]:
        out: list[ShellCommand] = []
        segment: list[_Word] = []
        in_test = False  # inside ``[[ ... ]]``, where && and || are not command separators
        for kind, text, plain, expanded in [*self.tokens, ("op", ";", 0, False)]:
            if in_test:
                in_test = not (kind == "word" and text == "]]")
            elif kind == "word" and text == "[[" and plain == 2 and _only_reserved(segment):
                in_test = True
            elif kind == "word":
                segment.append((text, plain, expanded))
            else:
                command = self.simple_command(segment)
                if command is not None:
                    out.append(command)
                segment = []
        return out

    def simple_command(self, words: list[_Word]) -> ShellCommand | None:
        i = 0
        while i < len(words) and _is_reserved(words[i], _PREFIX):
            if (
                words[i][0] == "coproc"
                and i + 2 < len(words)
                and _is_reserved(words[i + 2], _RESERVED_PREFIX)
            ):
                i += 1  # ``coproc NAME { ...; }``: NAME names the coprocess
            elif words[i][0] == "repeat":
                i += 1  # its count
            i += 1
        if i < len(words) and _is_reserved(words[i], _HEADERS):
            if i + 2 < len(words) and _is_reserved(words[i + 2], _DO):
                return self.simple_command(words[i + 3 :])  # ``for NAME do CMD``: no ``in``
            return None
        if i < len(words) and _is_reserved(words[i], frozenset(("function",))):
            self.flag("function definition")
            return self.simple_command(words[i + 2 :])  # ``function NAME { CMD``: CMD is read
        assignments = []
        while i < len(words) and _is_assignment(words[i]):
            assignments.append(words[i][0])
            i += 1
        rest = tuple(w[0] for w in words[i:])
        if not rest and not assignments:
            return None
        expanded = tuple(k for k, w in enumerate(words[i:]) if w[2])
        return ShellCommand(assignments=tuple(assignments), words=rest, expanded=expanded)


def _expands(unquoted: str) -> bool:
    """Whether a word's unquoted characters make the shell expand it: a file-name pattern
    (``*``, ``?``, ``[...]``) or braces holding a comma or a range (``{}`` alone is a
    word: find's). Linear in the word, which the model writes (no backtracking regex)."""
    if "*" in unquoted or "?" in unquoted:
        return True
    bracket = unquoted.find("[")
    if bracket >= 0 and "]" in unquoted[bracket + 1 :]:
        return True
    return any("," in m[1] or ".." in m[1] for m in _BRACES.finditer(unquoted))


def _is_reserved(word: _Word, names: frozenset[str]) -> bool:
    text, plain = word[0], word[1]
    return plain == len(text) and text in names


def _only_reserved(words: list[_Word]) -> bool:
    return all(_is_reserved(w, _RESERVED_PREFIX) for w in words)


def _is_assignment(word: _Word) -> bool:
    found = _ASSIGNMENT.match(word[0])
    return found is not None and found.end() <= word[1]


__all__ = ["ShellCommand", "ShellScript", "closing", "read_script"]
