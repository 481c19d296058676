"""`moespac` command line. Each subcommand lives in moespac/commands/<name>.py with `register(sub)`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import threading

from moespac.errors import MoespacError


def build_parser() -> argparse.ArgumentParser:
    import moespac.commands as commands

    from moespac import __version__

    parser = argparse.ArgumentParser(prog="moespac", description=__doc__.splitlines()[0])
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
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        rc = args.func(args)
    except MoespacError as e:
        print(f"moespac {args.command}: error: {e}", file=sys.stderr)
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
