"""CLI flags generated from config dataclasses: a field's docstring is its flag's help, its default the flag's.

A config dataclass documents each field with a string right under it (as vLLM's configs do); `add_field_args`
turns the named fields into `--field-name` flags, so the help a user reads is the field's own documentation and
the defaults cannot drift apart.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap

_NUMBERS = {"int": int, "float": float}


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field: the docstring under it, on one line} of a dataclass and the dataclasses it inherits from (a
    subclass's own docstring wins); fields without one are left out."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def add_field_args(group, cls: type, *names: str, **overrides: dict) -> None:
    """Add `--name` for each dataclass field in `names`, stored under the field's name: the field's default, its
    docstring as help; a bool field is a switch (`--name` when it defaults to False, `--no-name` when True).
    `overrides[name]` adds or replaces argparse keywords (type, choices, help...); its 'flag' renames the flag."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    docs = field_docs(cls)
    for name in names:
        f = fields[name]  # KeyError: a flag for a field the config does not have
        kw = dict(help=docs.get(name, ""), dest=name)
        default = f.default if f.default is not dataclasses.MISSING else None
        flag = f"--{name.replace('_', '-')}"
        if isinstance(default, bool):
            kw["action"] = "store_false" if default else "store_true"
            flag = f"--no-{name.replace('_', '-')}" if default else flag
        else:
            kw["default"] = default
            kind = _NUMBERS.get(str(f.type).split("|")[0].strip())  # 'int | None' -> int
            if kind:
                kw["type"] = kind
            if f.default is dataclasses.MISSING:
                kw["required"] = True
        kw.update(overrides.get(name, {}))
        group.add_argument(kw.pop("flag", flag), **kw)


def config_from_args(cls: type, args, **given):
    """`cls` from the flags of its fields that `args` holds (add_field_args stores each under its field's name);
    `given` adds or overrides values (what a command derives, e.g. a tuple from a repeated flag)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **given})
