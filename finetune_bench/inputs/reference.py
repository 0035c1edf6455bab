"""The settings reference, written from the settings themselves: every field of an inputs section with its
type, its default and the comment that documents it where it is declared (the one place it is documented)."""

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

from finetune_bench.inputs.rules import EVERYWHERE, field_scope


def field_docs(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` → the comment lines right above its declaration, joined. A comment block
    above several fields with no blank line between them documents them all; a field without one maps to ""."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    docs: dict[str, str] = {}
    current, previous_end = "", -1
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#"):
            comment.insert(0, lines[row].strip().removeprefix("#").strip())
            row -= 1
        if comment:
            current = " ".join(comment)
        elif node.lineno - 2 != previous_end:  # a blank line or other code ends the block a comment documents
            current = ""
        docs[node.target.id] = current
        previous_end = node.end_lineno - 1
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_reference(cls: type, title: str, intro: str = "") -> str:
    """A Markdown section: the class's docstring (or `intro`), then a table with one row per field, or per group
    of consecutive fields that one comment documents."""
    docs = field_docs(cls)
    rows: list[tuple[list[dataclasses.Field], str]] = []
    for f in dataclasses.fields(cls):
        doc = docs.get(f.name, "")
        if rows and doc and rows[-1][1] == doc:
            rows[-1][0].append(f)
        else:
            rows.append(([f], doc))
    out = [f"## {title}", "", intro or inspect.getdoc(cls) or "", ""]
    out += ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for fields, doc in rows:
        names = "<br>".join(f"`{f.name}`" for f in fields)
        types = "<br>".join(_cell(_type_name(f.type)) for f in fields)
        defaults = "<br>".join(_cell(f"`{_default(f)!r}`") for f in fields)
        # where the settings act, as declared beside them (`rules.acts_only`), once for the group
        scopes = list(dict.fromkeys(scope.where for f in fields if (scope := field_scope(f)) is not None))
        acts = "".join(
            " Acts in every condition."
            if where == EVERYWHERE
            else f" Acts only {where} (set elsewhere: refused at planning)."
            for where in scopes
        )
        out.append(f"| {names} | {types} | {defaults} | {_cell(doc + acts)} |")
    return "\n".join(out) + "\n"
