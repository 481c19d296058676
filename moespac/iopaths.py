"""Checks on a command's file arguments before any work: no output may replace an input or another output, and
every output's folder must take a file, so a command writes all of its outputs or none.

A command declares them once, `p.set_defaults(io=IO(outputs=("out", "json"), inputs=("trace",)))`, by the
names of its options; `moespac.cli.main` checks every command the same way.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from moespac.errors import MoespacError


@dataclass(frozen=True)
class IO:
    """The options of a command that name files it writes and files (or folders) it reads."""

    outputs: tuple[str, ...] = ()
    """Options naming a file the command writes (a value of None: not given)."""
    inputs: tuple[str, ...] = ()
    """Options naming a file or folder the command reads; a list value names several."""
    positional: tuple[str, ...] = ()
    """Which of those names are positional arguments (named in capitals in messages, not as --flags)."""

    def flag(self, name: str) -> str:
        return name.upper() if name in self.positional else f"--{name.replace('_', '-')}"


def _values(args, name: str) -> list[str]:
    value = getattr(args, name, None)
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    # `LABEL=PATH` pairs (report --trace) name their path after the '='
    return [str(v).partition("=")[2] if "=" in str(v) and not os.path.exists(str(v)) else str(v) for v in values]


def _same(a: str, b: str) -> bool:
    """Whether two spellings name one file: symlinks, `./` and `..` resolved, hard links by inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.isdir(folder) and Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except OSError:
        return False


def writable_folder(path: str, what: str) -> None:
    """Refuse, naming the option, an output whose folder cannot take a new file (read-only, immutable, a file in
    the way); probes the nearest existing folder with a temporary file, and creates nothing that stays."""
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise MoespacError(f"{what} {path}: {probe} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moespac-probe.", dir=probe)
    except OSError as e:
        raise MoespacError(f"{what} {path}: cannot write in {probe} ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def check_io(args, io: IO) -> None:
    """Raise MoespacError, naming both options, where an output is an input, another output, inside an input
    folder, or a folder; or where an output's folder takes no file."""
    outs = [(io.flag(n), v) for n in io.outputs for v in _values(args, n)]
    ins = [(io.flag(n), v) for n in io.inputs for v in _values(args, n)]
    for i, (name, path) in enumerate(outs):
        if os.path.isdir(path):
            raise MoespacError(f"{name} {path}: is a folder; give a file path to write")
        for in_name, in_path in ins:
            if _same(path, in_path):
                raise MoespacError(f"{name} {path} is the input {in_name} {in_path}; writing it would destroy the "
                                   "input: give another output path")
            if _inside(path, in_path) and os.path.exists(path):
                raise MoespacError(f"{name} {path} lies inside the input folder {in_name} {in_path}; give a path "
                                   "outside it")
        for other_name, other in outs[:i]:
            if _same(path, other):
                raise MoespacError(f"{name} {path} is also {other_name}: each output needs its own path")
    for name, path in outs:
        writable_folder(path, name)
