"""Build llama.cpp from the source vendored in the `llama-cpp-python` sdist on PyPI (or a user's checkout).

One cacheable step: download the sdist (once), unpack it, configure with CMake (CUDA when a GPU and nvcc
are present) and build only the tools the wrapped runs need. A stamp file records the source digest, the
flags, the targets and the host CPU; a build whose stamp matches and whose binaries exist is not redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

from baselines.programs._common import RESOURCES, cuda_missing_reason, nvcc_missing_reason, run_logged
from moespac.atomic import write_json, write_text
from moespac.errors import MoespacError
from moespac.fetch import pip_download

VERSION = "0.3.36"
"""llama-cpp-python release whose sdist vendors the llama.cpp tree we build (vendor/llama.cpp)."""
ROOT = RESOURCES / "llamacpp"
SRC_ENV = "MOESPAC_LLAMACPP_SRC"
"""Environment variable naming a llama.cpp checkout to build instead of the sdist."""
TARGETS = ("llama-completion", "llama-speculative", "llama-speculative-simple", "llama-tokenize", "llama-bench")
"""Plain decoding, the two speculative decoders, the tokeniser (for the token-id check), the benchmark tool."""
STAMP = "build-stamp.json"
FLUSHED_TOOLS = ("examples/speculative-simple/speculative-simple.cpp", "examples/speculative/speculative.cpp",
                 "tools/completion/completion.cpp")
"""Sources of the tools whose summary lines the wrapped runs parse (patched by flush_log_at_exit)."""
FLUSH_LINE = "    common_log_flush(common_log_main()); // moespac: print the queued log (llama.cpp #22142)\n"


@dataclass(frozen=True)
class Build:
    """A finished build: where its tools are and what produced them."""

    bin_dir: str
    """Folder with the built tools (llama-completion, llama-speculative-simple, ...)."""
    source_dir: str
    """The llama.cpp tree (its convert_hf_to_gguf.py and gguf-py are used for conversion)."""
    source: str
    """Digest of what was built: `sdist-sha256:...` or `checkout:<git commit or path>`."""
    version: str
    """`llama-cpp-python==V` for the sdist, `checkout` for a user tree."""
    llama_commit: str | None
    """llama.cpp's own version line (`--version`), e.g. 'version: 0.5.0-dev (build 1, commit 0c1e570)'."""
    cuda: bool
    cpu_only_reason: str | None
    """Why this is not a CUDA build (None for a CUDA build)."""
    flags: tuple[str, ...]
    """CMake configure flags."""
    targets: tuple[str, ...]
    host: str
    """CPU the build was tuned for (host_id)."""
    patches: tuple[str, ...] = ()
    """Changes made to the source before building (flush_log_at_exit on the sdist; none on a user's checkout)."""

    def tool(self, name: str) -> str:
        return str(Path(self.bin_dir) / name)


def cmake_flags(cuda: bool) -> list[str]:
    """Configure flags: Release, static tools, no network, no tests/server/UI; -DGGML_CUDA=ON for a GPU build."""
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF"]
    return flags + (["-DGGML_CUDA=ON"] if cuda else [])


def host_id() -> str:
    """The CPU the build targets (GGML_NATIVE tunes for it, so a cached build is only valid on its like)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                model += line.split(":", 1)[1].strip() + ";"
    except OSError:
        pass
    return f"{platform.machine()}:{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def resolve_cuda(cuda) -> tuple[bool, str | None]:
    """(build with CUDA?, why not): 'auto' = when a GPU is visible and nvcc exists; 'on' demands both."""
    if cuda in (False, "off", "no", "false"):
        return False, "CUDA build turned off (--cuda off)"
    reason = cuda_missing_reason() or nvcc_missing_reason()
    if cuda in (True, "on", "yes", "true"):
        if reason:
            raise MoespacError(f"--cuda on: {reason}")
        return True, None
    if cuda != "auto":
        raise MoespacError(f"--cuda {cuda!r}: one of auto, on, off")
    return reason is None, reason


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(root: Path = ROOT, version: str = VERSION) -> Path:
    """The sdist tarball under root/sdist, downloaded once with pip (sources only, no dependencies)."""
    return pip_download(f"llama-cpp-python=={version}", root / "sdist", f"llama_cpp_python-{version}.tar.gz",
                        sources=True)


def unpack_sdist(tarball: Path, root: Path = ROOT) -> tuple[Path, str]:
    """(vendor/llama.cpp of the unpacked sdist, 'sdist-sha256:<digest>'); unpacks once per digest."""
    digest = sha256_file(tarball)
    top = root / "src" / tarball.name.removesuffix(".tar.gz")
    marker = top / ".moespac-unpacked"
    if not (marker.is_file() and marker.read_text().strip() == digest):
        with tarfile.open(tarball) as tf:
            tf.extractall(root / "src", filter="tar")
        marker.write_text(digest + "\n")
    llama = top / "vendor" / "llama.cpp"
    if not (llama / "CMakeLists.txt").is_file():
        raise MoespacError(f"{tarball.name} has no vendor/llama.cpp tree")
    return llama, f"sdist-sha256:{digest}"


def flush_log_at_exit(llama: Path) -> str:
    """Make each parsed tool flush llama.cpp's log queue before `main` returns; returns the patch's name.

    llama.cpp prints its log from a background thread and deliberately never joins it at exit (llama.cpp
    issues 22142, PRs 22273 and 25504), so on a busy machine a run that succeeded often exits before its
    summary lines (tokens/s, acceptance) are printed. Upstream flushes case by case with the same call;
    the tools compute nothing differently. Idempotent: a source that has the line is left alone.
    """
    for rel in FLUSHED_TOOLS:
        path = llama / rel
        text = path.read_text(encoding="utf-8")
        if FLUSH_LINE in text:
            continue
        end = text.rfind("\n    return 0;\n}")
        if end < 0:
            raise MoespacError(f"{path}: no final 'return 0;' in main to flush llama.cpp's log before")
        write_text(path, text[:end + 1] + FLUSH_LINE + text[end + 1:])
    return f"flush-log-at-exit:{hashlib.sha256(FLUSH_LINE.encode()).hexdigest()[:12]}"


def checkout_source(src: Path) -> tuple[Path, str]:
    """A user-given llama.cpp checkout and its identity (git commit when it is a repository)."""
    src = Path(src).resolve()
    if not (src / "CMakeLists.txt").is_file() or not (src / "convert_hf_to_gguf.py").is_file():
        raise MoespacError(f"llama.cpp source {src}: not a llama.cpp tree (no CMakeLists.txt / convert_hf_to_gguf.py)")
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return src, f"checkout:{commit or src}"


def wanted_stamp(source: str, version: str, cuda: bool, targets, patches=()) -> dict:
    return dict(source=source, version=version, cuda=cuda, flags=cmake_flags(cuda), targets=sorted(targets),
                host=host_id(), patches=list(patches))


def up_to_date(out: Path, wanted: dict) -> bool:
    """True when out/STAMP equals `wanted` (same source, flags, targets, host) and every tool exists."""
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    have = {k: stamp.get(k) for k in wanted}
    return have == wanted and all((out / "build" / "bin" / t).is_file() for t in wanted["targets"])


def tool_version(binary: Path) -> str | None:
    try:
        res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("version:")]
    return lines[0].strip() if lines else None


def build(src_dir: str | os.PathLike | None = None, out: str | os.PathLike | None = None, cuda="auto",
          version: str = VERSION, jobs: int | None = None, targets=TARGETS, root: Path = ROOT) -> Build:
    """Build (or reuse) llama.cpp; returns the Build. `src_dir` (or $MOESPAC_LLAMACPP_SRC) replaces the sdist."""
    cuda, cpu_only_reason = resolve_cuda(cuda)
    kind = "cuda" if cuda else "cpu"
    src_dir = src_dir or os.environ.get(SRC_ENV)
    if src_dir:
        llama, source = checkout_source(Path(src_dir))
        patches = ()  # a user's tree is built as it is; execute() retries a run whose summary got lost
        label, default_out = "checkout", root / f"checkout-{hashlib.sha256(source.encode()).hexdigest()[:10]}-{kind}"
    else:
        llama, source = unpack_sdist(fetch_sdist(root, version), root)
        patches = (flush_log_at_exit(llama),)
        label, default_out = f"llama-cpp-python=={version}", root / f"{version}-{kind}"
    out = Path(out) if out else default_out
    wanted = wanted_stamp(source, label, cuda, targets, patches)
    if not up_to_date(out, wanted):
        log = out / "build.log"
        log.unlink(missing_ok=True)
        (out / STAMP).unlink(missing_ok=True)  # a failed rebuild must not look finished
        generator = ["-G", "Ninja"] if _have("ninja") else []
        run_logged(["cmake", "-S", llama, "-B", out / "build", *generator, *wanted["flags"]], log,
                   what="cmake configure")
        run_logged(["cmake", "--build", out / "build", "-j", str(jobs or os.cpu_count() or 1),
                    "--target", *wanted["targets"]], log, what="cmake build")
        stamp = dict(wanted, llama_commit=tool_version(out / "build" / "bin" / "llama-completion"),
                     source_dir=str(llama))
        write_json(out / STAMP, stamp)
    stamp = json.loads((out / STAMP).read_text())
    return Build(bin_dir=str(out / "build" / "bin"), source_dir=str(llama), source=source, version=label,
                 llama_commit=stamp.get("llama_commit"), cuda=cuda, cpu_only_reason=cpu_only_reason,
                 flags=tuple(wanted["flags"]),
                 targets=tuple(wanted["targets"]), host=wanted["host"], patches=tuple(patches))


def build_info(b: Build) -> dict:
    return asdict(b)


def _have(program: str) -> bool:
    from shutil import which

    return which(program) is not None
