"""The command lines a document quotes: ``ddlf-train ...`` and ``python benchmarks/...``.

Found in fenced code blocks of shell (no language, or bash, sh, shell, console; a block
marked ``text`` is a usage pattern, not a command), a line with its ``\\`` continuations
joined as the shell joins them, and in inline code spans that hold a whole
``python benchmarks/...`` command (an inline ``ddlf-train run --scheme`` names a flag).
Each simple command of a line counts (``a && b``, ``a | b``); leading environment
assignments, ``sudo``, ``nice -n N`` and ``timeout N`` are dropped; ``#`` starts a
comment, and a redirection ends the command. Returns
``(line_number, command, argv)`` with ``command`` the script's path (or
``"ddlf-train"``).
"""

from __future__ import annotations

import re
import shlex

_FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
_SHELL = ("", "bash", "sh", "shell", "console")
_END = re.compile(r"^\d*[<>]")
_INLINE = re.compile(r"`([^`\n]+)`")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _segments(text: str) -> list:
    """The simple commands of a shell line: split at ``&&``, ``||``, ``;`` and ``|`` (as
    words of their own); a redirection (``>f``, ``2>/dev/null``) ends its command; ``#``
    starts a comment."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:   # an unbalanced quote: not a command line
        return []
    out, cur, skip = [], [], False
    for w in words:
        if w in ("&&", "||", ";", "|", "&"):
            out.append(cur)
            cur, skip = [], False
        elif skip or _END.match(w):
            skip = True   # a redirection and what follows it, to the next command
        else:
            cur.append(w)
    return out + [cur]


def _command(words: list):
    while words:
        if _ENV.match(words[0]) or words[0] in ("sudo", "$", "env"):
            words = words[1:]
        elif words[0] in ("nice", "timeout"):
            words = words[1:]
            if words and words[0] == "-n":
                words = words[1:]
            if words and re.fullmatch(r"[-+]?\d+[smh]?", words[0]):
                words = words[1:]
        else:
            break
    if words[:1] == ["ddlf-train"]:
        return "ddlf-train", words[1:]
    if (len(words) >= 2 and re.fullmatch(r"(\S*/)?python(3(\.\d+)?)?", words[0])
            and words[1].startswith("benchmarks/") and words[1].endswith(".py")):
        return words[1], words[2:]
    return None


def commands(text: str) -> list:
    out = []
    lines = text.split("\n")
    fence = None   # the open block's language, None outside one
    i = 0
    while i < len(lines):
        line, start = lines[i], i + 1
        m = _FENCE.match(line)
        if m:
            fence = m.group(2).lower() if fence is None else None
            i += 1
            continue
        if fence is not None:
            # The shell drops a backslash-newline and keeps the next line as it is.
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + lines[i]
            if fence in _SHELL:
                for words in _segments(line):
                    found = _command(words)
                    if found:
                        out.append((start, *found))
        else:
            for span in _INLINE.findall(line):
                for words in _segments(span):
                    found = _command(words)
                    if found and found[0] != "ddlf-train":
                        out.append((start, *found))
        i += 1
    return out
