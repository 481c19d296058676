"""`moespac` command line.

Each subcommand lives in moespac/commands/<name>.py with `register(sub)`, found by `build_parser`; every
parser is a `Parser`, so all `--help` pages show defaults by one rule (`DefaultsFormatter`).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import pkgutil
import signal
import sys
import threading

from moespac import pinning
from moespac.errors import MoespacError
from moespac.iopaths import check_io
from moespac.record import mark_started

DESCRIPTION = ("Reproduce and benchmark MoE-SpAc (arXiv 2603.09983), which schedules the experts of a "
               "Mixture-of-Experts model between GPU and CPU using speculative decoding as a lookahead. moespac "
               "runs it and the offloading baselines on a real engine or a simulator, and builds the paper's "
               "tables and figures from the result records.")
EPILOG = "Run `moespac COMMAND --help` for the options of one command."


def shows_default(action: argparse.Action) -> bool:
    """Whether --help prints this option's default. Not for a flag (nargs=0: its presence is the value, so
    'False' would mislead), nor for a default of None, SUPPRESS or an empty string or list: those mean
    'not given', and the help text says what happens then (e.g. 'default: the GPU's free memory')."""
    d = action.default
    empty = d is None or d is argparse.SUPPRESS or (isinstance(d, (str, list, tuple)) and not d)
    return action.nargs != 0 and not empty


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends '(default: X)' to each option that `shows_default`, unless its help already has %(default)."""

    def _format_action(self, action):
        if shows_default(action) and "%(default)" not in (action.help or ""):
            action = copy.copy(action)  # argparse prints no help column for an option without help text
            action.help = f"{action.help or ''} (default: %(default)s)".strip()
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """Every moespac parser: add_subparsers builds sub-commands of type(self), so they inherit the formatter."""

    def __init__(self, *args, formatter_class=DefaultsFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    import moespac.commands as commands
    from moespac import __version__

    parser = Parser(prog="moespac", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"moespac {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):  # shared helpers, not commands
            continue
        try:
            importlib.import_module(f"moespac.commands.{mod.name}").register(sub)
        except ImportError as e:  # one command's missing dependency must not take the whole CLI down
            name = mod.name.replace("_", "-")
            broken = sub.add_parser(name, help=f"(unavailable: {e})")
            broken.set_defaults(func=_unavailable(name, e))
    return parser


def _unavailable(name: str, error: Exception):
    def run(args):
        raise MoespacError(f"command {name!r} is unavailable: {error}")

    return run


class Terminated(KeyboardInterrupt):
    """SIGTERM (how Snakemake and Slurm stop a job): unwinds like Ctrl-C, so a run writes its failure record."""


def _terminate(signum, frame):
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mark_started()  # a timed record says when its command began
    pinning.warn_if_unpinned()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        if getattr(args, "io", None) is not None:
            check_io(args, args.io)  # before any work: no output replaces an input, every output can be written
        rc = args.func(args)
    except MoespacError as e:
        print(f"moespac {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a folder that takes no file, a full disk: the path and the reason, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"moespac {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"moespac {args.command}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"moespac {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
