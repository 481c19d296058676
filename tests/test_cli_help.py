"""What the CLI tells a user: every --help shows its options' defaults, the top-level help says what moespac is,
and `policy list` shows each policy's options (read from its constructor), stand-in and catalogue methods."""

import argparse
import dataclasses
import inspect
import json
import re
import sys

import pytest

import moespac.cli
from moespac.cli import build_parser, main
from moespac.registry import make_policy, parse_policy, policies
from moespac.catalogue import METHODS


def all_parsers(parser, path=("moespac",)):
    """(command path, parser) for `parser` and every sub-command and sub-sub-command below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, path + (name,))


def help_entries(text: str) -> dict[str, str]:
    """{first option string: its entry on the help page, whitespace collapsed}."""
    entries, current = {}, None
    for line in text.splitlines():
        if line.startswith("  -"):  # an option's invocation; its help continues on deeper-indented lines
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current and line.startswith("   "):
            entries[current] += " " + line
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def test_every_help_shows_each_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal width; keep defaults on one line
    checked = 0
    for path, parser in all_parsers(build_parser()):
        entries = help_entries(parser.format_help())
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            entry, d = entries[action.option_strings[0]], action.default
            # the rule (moespac/cli.py shows_default): flags and defaults meaning 'not given' print nothing
            if action.nargs == 0 or d is None or d is argparse.SUPPRESS or d in ("", []):
                assert not re.search(r"\(default: (None|False|True|\[\])\)", entry), (path, entry)
                continue
            assert re.search(rf"default:? {re.escape(str(d))}(?!\w)", entry), (path, action.option_strings, entry)
            checked += 1
    assert checked > 50  # bench, simulate, wrapped ... all walked


def test_top_level_help_is_for_users_and_the_developer_note_stays_in_the_code(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "register(sub)" not in out and "moespac/commands" not in out
    assert "MoE-SpAc" in out and "moespac COMMAND --help" in out
    assert "register(sub)" in moespac.cli.__doc__


def policy_blocks(capsys) -> dict[str, str]:
    """{policy name: the detail lines under its row in `moespac policy list`, joined into one line}."""
    assert main(["policy", "list"]) == 0
    blocks, name = {}, None
    for line in capsys.readouterr().out.split("\n\n")[0].splitlines()[1:]:
        if line.startswith(" "):
            blocks[name] += " " + line.strip()
        else:
            name = line.split()[0]
            blocks[name] = ""
    return {name: " ".join(text.split()) for name, text in blocks.items()}


def constructor_options(cls) -> dict:
    """What make_policy can pass the constructor: its keyword parameters, or for one that takes **options into
    a config dataclass (MoE-SpAc), the fields of the config it keeps."""
    if cls.__init__ is object.__init__:
        return {}
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return {f.name: f.default for f in dataclasses.fields(cls().config)}
    return {k: p.default for k, p in params.items() if k != "self"}


def test_policy_list_shows_each_policys_options_with_their_defaults(capsys):
    blocks = policy_blocks(capsys)
    assert set(blocks) == set(policies())
    for name, cls in policies().items():
        listed = re.search(r"options: (.*?)(?: variants: | methods: |$)", blocks[name])[1]
        items = [] if listed == "none" else listed.split(", ")
        parsed = [parse_policy(f"{name}:{item}")[1] for item in items]  # read back as make_policy reads them
        assert [k for p in parsed for k in p] == list(constructor_options(cls)), name
        for item, option in zip(items, parsed):
            (key, value), = option.items()
            assert value == constructor_options(cls)[key], (name, item)
            make_policy(f"{name}:{item}")  # each option, at its default, is one make_policy accepts
    assert "variant=paper" in blocks["moespac"] and "lossy_transfer=true" in blocks["fate"]
    # each variant a policy documents is listed as a spec make_policy accepts
    for name, cls in policies().items():
        for options in cls.variants:
            assert f"variants: {name}:{options} = " in blocks[name] or f" {name}:{options} = " in blocks[name], name
            make_policy(f"{name}:{options}")


def test_policy_list_json_has_the_same_options(capsys):
    assert main(["policy", "list", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert set(listed) == set(policies())
    for name, cls in policies().items():
        assert listed[name]["options"] == constructor_options(cls)
        assert listed[name]["stand_in"] == cls.stand_in


def test_policy_list_names_each_catalogue_method_under_its_policy(capsys):
    blocks = policy_blocks(capsys)
    assert 'moespac-released = moespac:variant=released-code, "MoE-SpAc (released code)"' in blocks["moespac"]
    for slug, method in METHODS.items():
        mode = "SD" if method.draft else "AR"
        assert f'{slug} = {method.policy}, "{method.label}" ({mode})' in blocks[parse_policy(method.policy)[0]]


def test_policy_list_marks_the_stand_ins_their_baselines_document(capsys):
    blocks = policy_blocks(capsys)

    def documents_a_stand_in(cls):  # the policy's module or a class it builds on says so in its docstring
        docs = [sys.modules[cls.__module__].__doc__] + [k.__doc__ for k in cls.__mro__]
        return any("stand-in" in (d or "").lower() for d in docs)

    marked = {name for name, cls in policies().items() if cls.stand_in}
    assert marked == {name for name, cls in policies().items() if documents_a_stand_in(cls)}
    assert {"sp-moe", "moe-speq", "specexp"} <= marked
    for name, cls in policies().items():
        assert (f"stand-in: {cls.stand_in}" in blocks[name]) == bool(cls.stand_in), name
        assert ("stand-in:" in blocks[name]) == bool(cls.stand_in), name


def test_bench_flags_of_config_fields_carry_the_fields_docstring_and_default():
    from moespac.bench.harness import BenchConfig
    from moespac.configargs import field_docs

    docs = field_docs(BenchConfig)
    assert docs["max_new_tokens"] == "Generation length cap per request (the paper: 512)."
    assert docs["cache_ratio"].startswith("Device expert slots / all routed experts (MoE layers x experts), in [0, 1]")
    parsers = dict(all_parsers(build_parser()))
    bench = parsers[("moespac", "bench")]
    by_dest = {a.dest: a for a in bench._actions}
    defaults = {f.name: f.default for f in dataclasses.fields(BenchConfig)}
    generated = ["source", "limit", "turns", "batch_size", "max_new_tokens", "ignore_eos", "temperature", "warmup",
                 "seed", "timing", "hardware", "model_spec", "draft_spec", "allow_topology_mismatch", "from_trace",
                 "cache_ratio", "cache_gib", "per_layer", "warmup_steps", "bounds"]
    for name in generated:
        action = by_dest[name]
        assert action.help == docs[name] and action.default == defaults[name], name
    # one cache config: the engine's, the bench's and the simulator's cache flags are CacheSize's, word for word
    from moespac.cache import CacheSize
    from moespac.engine.session import EngineConfig
    from moespac.sim.simulate import SimConfig

    simulate = {a.dest: a for a in parsers[("moespac", "simulate")]._actions}
    for name, doc in field_docs(CacheSize).items():
        assert docs[name] == field_docs(SimConfig)[name] == field_docs(EngineConfig)[name] == doc, name
        assert by_dest[name].help == simulate[name].help == doc, name
    switches = bench.parse_args(["--benchmark", "gsm8k", "--out", "x.json", "--no-bounds", "--per-layer-cache"])
    assert (switches.bounds, switches.per_layer) == (False, True)
    assert by_dest["batch_size"].type is int and by_dest["limit"].type is int and by_dest["ignore_eos"].nargs == 0
    args = bench.parse_args(["--benchmark", "gsm8k", "--out", "x.json", "--limit", "3", "--ignore-eos"])
    assert (args.limit, args.ignore_eos, args.max_new_tokens) == (3, True, 512)
