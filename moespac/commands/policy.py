"""`moespac policy list`: every registered scheduling policy with its flags, source, options and methods."""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
import typing

from moespac.registry import parse_policy, policies

WIDTH = 100  # the detail lines under each row wrap here, so the listing reads in a 100-column terminal
LEGEND = ("methods: the names a workflow config uses (moespac/catalogue.py METHODS); SD = speculative decoding "
          "with the draft, AR = autoregressive")


def policy_options(cls) -> dict:
    """Keyword options `make_policy` accepts after `name:`, with their defaults, in signature order.

    A constructor taking **options beside a config dataclass (MoE-SpAc) takes that dataclass's fields as
    its options: they are listed in place of the config object, which a spec string cannot give.
    """
    if cls.__init__ is object.__init__:  # no constructor of its own: no options (make_policy's rule)
        return {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    hints = typing.get_type_hints(cls.__init__) if takes_any else {}
    out = {}
    for p in params:
        config = _dataclass_in(hints.get(p.name))
        if config is not None:
            out.update({f.name: f.default for f in dataclasses.fields(config)})
        elif p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            out[p.name] = p.default
    return out


def _dataclass_in(hint):
    """The dataclass named by a type hint such as `MoESpAcConfig | None`, else None."""
    for t in typing.get_args(hint) or (hint,):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def spec_value(value) -> str:
    """A default written the way `make_policy` reads it back: true/false, none, numbers and words as they are."""
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)


def policy_methods(name: str) -> list[dict]:
    """The catalogue methods (paper table rows) that run policy `name`, in catalogue order."""
    from moespac.catalogue import METHODS

    return [dict(slug=slug, policy=m.policy, label=m.label, draft=m.draft)
            for slug, m in METHODS.items() if parse_policy(m.policy)[0] == name]


def policy_info(name: str, cls) -> dict:
    """Everything `policy list` shows about one policy; its entry in `policy list --json`."""
    return dict(name=name, lossless=cls.lossless, needs_draft=cls.needs_draft, requires=list(cls.requires),
                source=cls.source, stand_in=cls.stand_in, options=policy_options(cls), variants=dict(cls.variants),
                methods=policy_methods(name))


def detail_lines(info: dict) -> list[str]:
    """The indented lines under a policy's row: source, stand-in (when there is one), options, variants, methods."""
    name = info["name"]
    options = ", ".join(f"{k}={spec_value(v)}" for k, v in info["options"].items()) or "none"
    methods = [f'{m["slug"]} = {m["policy"]}, "{m["label"]}" ({"SD" if m["draft"] else "AR"})' for m in info["methods"]]
    fields = [("source:", info["source"] or "-"), ("stand-in:", info["stand_in"]), ("options:", options)]
    fields += [("variants:" if i == 0 else "", f"{name}:{opts} = {what}")
               for i, (opts, what) in enumerate(info["variants"].items())]  # one variant per line
    fields += [("methods:" if i == 0 else "", m) for i, m in enumerate(methods)]  # one method per line
    lines = []
    for label, text in fields:
        if text:
            lines += textwrap.wrap(text, WIDTH, initial_indent=f"    {label:10}", subsequent_indent=" " * 14,
                                   break_long_words=False, break_on_hyphens=False)
    return lines


def policy_table(infos: list[dict]) -> list[list[str]]:
    """Header plus one row of the short columns per policy."""
    yes = {True: "yes", False: "no"}
    return [["NAME", "LOSSLESS", "NEEDS_DRAFT", "REQUIRES"]] + [
        [i["name"], yes[i["lossless"]], yes[i["needs_draft"]], ",".join(i["requires"]) or "-"] for i in infos]


def list_policies(args) -> int:
    infos = [policy_info(name, cls) for name, cls in sorted(policies().items())]
    if args.json:
        print(json.dumps(infos, indent=2))
        return 0
    rows = policy_table(infos)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("  ".join(c.ljust(w) for c, w in zip(rows[0], widths)).rstrip())
    for row, info in zip(rows[1:], infos):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        print("\n".join(detail_lines(info)))
    print("\n" + textwrap.fill(LEGEND, WIDTH))
    return 0


def register(sub) -> None:
    p = sub.add_parser("policy", help="scheduling policies (MoE-SpAc and the baselines)")
    psub = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    what = ("print every registered policy: flags (lossless, needs_draft, requires), source, stand-in, options "
            "with their defaults and the catalogue methods that run it")
    ls = psub.add_parser("list", help=what, description=what)
    ls.add_argument("--json", action="store_true", help="print the same as a JSON list, for scripts")
    ls.set_defaults(func=list_policies)
