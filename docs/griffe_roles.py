"""A Griffe extension for the API reference: fedshift's docstrings are reST-flavoured
(``:func:`name``` roles, lists right under a sentence); this turns them into the Markdown
that mkdocstrings renders, without touching the source."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

# :func:`~fedshift.x.f` -> `f`; :class:`fedshift.x.C` -> `fedshift.x.C`
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|const|py:\w+):`(~?)([^`]+)`")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def _role(m: re.Match) -> str:
    name = m.group(2)
    return f"`{name.rsplit('.', 1)[-1] if m.group(1) else name}`"


def markdown(text: str) -> str:
    """Roles as inline code, a reST ``text::`` as ``text:`` (the indented block after it is
    code in Markdown too), and a blank line before a list that follows a sentence (Markdown
    needs it to see a list)."""
    out: list[str] = []
    in_list = False
    for line in _ROLE.sub(_role, text).splitlines():
        if line.endswith("::") and not line.strip().startswith(">>>"):
            line = line[:-2].rstrip() + ":" if line[:-2].strip() else ""  # reST literal block
        if not line.strip():
            in_list = False
        elif _ITEM.match(line):
            if out and out[-1].strip() and not in_list:
                out.append("")
            in_list = True
        out.append(line)
    return "\n".join(out)


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
