"""The configuration reference (docs/configuration.md), generated from the config dataclasses so it
cannot drift from the code: every key of a generation config (engine settings and each strategy's
section), its type, default, valid values and the comment written beside it in the source.

    python -m specdec.config_reference > docs/configuration.md     (what `make docs` runs)
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from .config import EngineConfig, spec_config_class

_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:\s*[^=]+?(?:=\s*(.*?))?\s*(?:#\s?(.*))?$")
_CONTINUATION = re.compile(r"^\s+#\s{5,}(.*)$")     # a comment continued under the field's own


def field_comments(cls) -> dict[str, str]:
    """{field: the comment beside it (and its continuation lines)} read from the source of the class and of
    the dataclasses it extends (a field redeclared lower down keeps the lower comment)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            found.update(_own_field_comments(klass))
    return found


def _own_field_comments(cls) -> dict[str, str]:
    """field_comments of the fields written in `cls`'s own body."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    found, last = {}, None
    for line in lines:
        more = _CONTINUATION.match(line)
        if more and last:
            found[last] = f"{found[last]} {more.group(1).strip()}".strip()
            continue
        match = _FIELD_LINE.match(line)
        if match and "#" in line:
            last = match.group(1)
            found[last] = line.split("#", 1)[1].strip()
        elif match:
            last = match.group(1)
    return found


def _type_name(annotation) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = text.replace("typing.", "").replace("NoneType", "None")
    text = re.sub(r"Optional\[(.*)\]$", r"\1 or None", text)
    text = re.sub(r"Union\[(.*), None\]$", r"\1 or None", text)
    return text.replace("List[", "list[").replace("Dict[", "dict[")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default).replace("'", "")
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "" if dataclasses.is_dataclass(value) else repr(value)
    return "(required)"


def _limits(f: dataclasses.Field) -> str:
    limits = f.metadata.get("limits", {})
    words = {"min": ">= {}", "above": "> {}", "max": "<= {}", "item_min": "each >= {}"}
    parts = [words[k].format(v) for k, v in limits.items() if k in words]
    if "choices" in limits:
        parts.append(" / ".join(str(c) for c in limits["choices"]))
    if "item_choices" in limits:
        parts.append("each: " + " / ".join(str(c) for c in limits["item_choices"]))
    return ", ".join(parts)


def _rows(cls, prefix: str) -> list[str]:
    notes, hints = field_comments(cls), typing.get_type_hints(cls)      # string annotations resolved once
    rows = []
    for f in dataclasses.fields(cls):
        kind = hints.get(f.name, f.type)
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            continue                      # a section: listed under its own heading
        note = notes.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | {_type_name(kind)} | `{_default(f)}` | {_limits(f)} | {note} |")
    return rows


def reference() -> str:
    spec = spec_config_class()
    out = ["# Configuration reference", "",
           "Every key of a generation config, generated from the config dataclasses "
           "(`python -m specdec.config_reference`; a test checks this page is up to date). Set a key in "
           "a YAML file, as `specdec.load(name, **{\"section.key\": value})`, or as `section.key=value` on "
           "the command line; an unknown key or a value outside its range is an error that says which.", ""]
    header = ["| key | type | default | valid values | meaning |", "|---|---|---|---|---|"]
    out += ["## Engine", ""] + header + _rows(EngineConfig, "") + [""]
    for f in dataclasses.fields(spec):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            cls = f.default_factory
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            out += [f"## `{f.name}`", ""] + ([doc, ""] if doc and not doc.startswith(cls.__name__ + "(") else [])
            out += header + _rows(cls, f"{f.name}.") + [""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
