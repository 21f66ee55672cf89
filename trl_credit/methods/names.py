"""What a method is called: its label (display name and arXiv id), and the papers of other methods that go by the same
name, which a registration names (`not_to_be_confused_with`) so that a user who means the other paper is told.

An unknown method name looks like another paper's method when every word of it (split at `_` and `-`) is the shared
name, the registered name, a word of the other paper's title or of its authors' group, or the initials of consecutive
title words (`po` for "Policy Optimization"), and it has two words at least: `gtpo_bytedance`, `entropy_aware_po`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def other_paper(name: str, title: str, arxiv_id: str, by: str = "") -> dict[str, str]:
    """A paper whose method goes by `name` as a registered one does, for `not_to_be_confused_with`; `by`: its authors'
    group, when the method is known by it ("ByteDance's GTPO")."""
    return {"name": name, "title": title, "id": arxiv_id, "by": by}


def label(method) -> str:
    """A registered method's display name and its paper's arXiv id, `"KTAE (arXiv 2505.16826)"`."""
    return f"{method.display_name} (arXiv {method.paper['id']})" if method.paper else method.display_name


def other_papers(name: str, others) -> tuple[Mapping[str, str], ...]:
    """Method `name`'s `not_to_be_confused_with`, once each record is known to be an [`other_paper`]."""
    for other in others:
        if sorted(other) != ["by", "id", "name", "title"]:
            raise ValueError(f"credit method {name!r}: not_to_be_confused_with holds other_paper(...), got {other!r}")
    return tuple(others)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _looks_like(name: str, method, other: Mapping[str, str]) -> bool:
    title = _words(other["title"])
    initials = {
        "".join(word[0] for word in title[i:j]) for i in range(len(title)) for j in range(i + 2, len(title) + 1)
    }
    known = {method.name, other["name"].lower(), *title, *_words(other["by"]), *initials}
    return len(_words(name)) >= 2 and set(_words(name)) <= known


def confusions(name: str, methods: Iterable) -> str:
    """For an unknown method `name`, what it looks like: `": 'gtpo_bytedance' looks like ByteDance's GTPO, ..."` for
    each other paper of `methods`' registrations it resembles, naming both papers; "" for none."""
    found = ""
    for method in methods:
        for other in (o for o in method.not_to_be_confused_with if _looks_like(name, method, o)):
            ours = f'"{method.paper["title"]}" (arXiv {method.paper["id"]})' if method.paper else method.display_name
            by = f"{other['by']}'s " if other["by"] else ""
            found += (
                f': {name!r} looks like {by}{other["name"]}, "{other["title"]}" (arXiv {other["id"]}), which is not '
                f"registered; the registered {method.name!r} is {ours}"
            )
    return found
