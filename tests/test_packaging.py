"""Packaging: pyproject's bounds say what CI tests, the rules' conda environment installs this package, the
Snakemake workflow catalog's settings parse and name files that exist, and a copy deployed the way
`snakedeploy deploy-workflow` deploys it (a module of workflow/Snakefile fetched from a GitHub tag, plus the
repository's config/ and profiles/) dry-runs the same jobs as workflow/Snakefile in a clone."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CATALOG = REPO / ".snakemake-workflow-catalog.yml"
ENV_FILE = REPO / "workflow" / "envs" / "moespac.yaml"
OWNER_REPO = "someowner/moespac"  # the GitHub repository the deployed copy names (served from a local clone)
TAG = "v0-test"


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def requirement(name: str) -> Requirement:
    reqs = [Requirement(r) for r in pyproject()["project"]["dependencies"]]
    return next(r for r in reqs if r.name == name)


def ci_pins() -> dict[str, Version]:
    """name -> the lowest version of the `name==version` pins .ci/run installs (it also runs the GPU check on the lent
    image's transformers, a release inside the range)."""
    text = (REPO / ".ci" / "run").read_text()
    pins: dict[str, Version] = {}
    for name, v in re.findall(r"\b(torch|transformers)==([0-9][0-9.]*)", text):
        pins[name] = min(pins.get(name, Version(v)), Version(v))
    return pins


def installed(name: str) -> Version:
    from importlib.metadata import version

    return Version(version(name))


# ---- pyproject's bounds


def test_torch_bounds_admit_the_tested_minor_release_only():
    spec, pins = requirement("torch").specifier, ci_pins()
    tested = pins["torch"]
    assert spec.contains(tested), f"torch {tested} (.ci/run) is outside pyproject's {spec}"
    assert spec.contains(installed("torch")), f"the torch installed here ({installed('torch')}) is outside {spec}"
    # only that minor release is tested: neither the one before nor the one after is admitted
    assert not spec.contains(f"{tested.major}.{tested.minor + 1}.0"), f"{spec} admits an untested newer torch"
    assert not spec.contains(f"{tested.major}.{tested.minor - 1}.0"), f"{spec} admits an untested older torch"


def test_transformers_bounds_are_the_two_ends_ci_tests():
    # CI tests the newest release the range resolves to and the lowest it admits (.ci/run pins that one)
    spec, lowest = requirement("transformers").specifier, ci_pins()["transformers"]
    assert spec.contains(lowest) and spec.contains(installed("transformers"))
    assert not spec.contains(f"{lowest.major}.{lowest.minor - 1}.0"), f"{spec} admits releases below {lowest}"
    assert not spec.contains(f"{lowest.major + 1}.0.0"), f"{spec} admits the next major release"


# ---- the rules' conda environment


def env_pip_specs() -> list[str]:
    env = yaml.safe_load(ENV_FILE.read_text())
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "the env file has no pip section"
    return pips[0]


def moespac_source(workdir: Path) -> str | Path | None:
    """Where the env file's pip step takes moespac from when Snakemake creates the env in `workdir`: a local
    project folder, a requirement naming moespac (index or URL), or None. Conda runs pip in the folder of the
    env file it is given, and Snakemake gives it a copy in its conda prefix, <workdir>/.snakemake/conda/."""
    pip_cwd = workdir / ".snakemake" / "conda"
    for spec in env_pip_specs():
        target = spec.split(None, 1)[1] if spec.startswith(("-e ", "--editable ")) else spec
        if target.startswith((".", "/")):  # a local path, relative to pip's working directory
            folder = (pip_cwd / target).resolve()
            project = folder / "pyproject.toml"
            if project.exists() and re.search(r'(?m)^name\s*=\s*"moespac"', project.read_text()):
                return folder
        elif not target.startswith("-") and Requirement(target).name == "moespac":
            return target
    return None


def test_env_file_is_a_complete_environment():
    env = yaml.safe_load(ENV_FILE.read_text())
    assert "conda-forge" in env["channels"]
    deps = env["dependencies"]
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python="))
    assert SpecifierSet(pyproject()["project"]["requires-python"]).contains(python.split("=", 1)[1] + ".0")
    assert "pip" in deps
    # torch exactly as CI installs it (the package's own bounds would take any 2.13.x)
    torch = [Requirement(s) for s in env_pip_specs() if s.startswith("torch")]
    assert torch and torch[0].specifier == SpecifierSet(f"=={ci_pins()['torch']}")
    assert requirement("torch").specifier.contains(ci_pins()["torch"])


def test_env_file_installs_this_checkout_when_run_from_the_repository_root():
    # (an env that names a published release instead would install that here too: change this test with it)
    source = moespac_source(REPO)
    assert source == REPO, f"the env's pip step would install moespac from {source!r}, not from {REPO}"
    # and pip builds it: the same editable install, dry (no dependencies, no download)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                        "--quiet", "--report", "-", "-e", str(source)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    [item] = json.loads(r.stdout)["install"]
    assert item["metadata"]["name"] == "moespac"
    assert item["metadata"]["version"] == pyproject()["project"]["version"]


def test_catalog_claims_conda_exactly_when_a_deployment_can_create_the_env(tmp_path):
    # a snakedeploy deployment holds workflow/, config/, profiles/ and LICENSE: no checkout of the package
    (tmp_path / "workflow").mkdir()
    deployable = moespac_source(tmp_path) is not None
    claimed = yaml.safe_load(CATALOG.read_text())["usage"]["software-stack-deployment"]["conda"]
    assert claimed == deployable, (f"{CATALOG.name} says conda: {claimed}, but a deployed copy's env "
                                   f"{'can' if deployable else 'cannot'} install moespac ({ENV_FILE})")


# ---- the workflow catalog's settings and layout


def test_catalog_settings_parse_and_name_files_that_exist():
    usage = yaml.safe_load(CATALOG.read_text())["usage"]
    assert set(usage) <= {"mandatory-flags", "software-stack-deployment", "report"}
    flags = usage["mandatory-flags"]
    assert isinstance(flags["desc"], str) and isinstance(flags["flags"], (str, list))
    methods = usage["software-stack-deployment"]
    assert methods and set(methods) <= {"conda", "apptainer", "apptainer+conda", "singularity", "singularity+conda"}
    assert all(isinstance(v, bool) for v in methods.values()) and isinstance(usage["report"], bool)
    # what the catalog reads: a README naming Snakemake and workflow, workflow/Snakefile (standardized usage),
    # config/README.md (shown as the configuration section); a rules/ folder beside the Snakefile needs *.smk
    readme = (REPO / "README.md").read_text().lower()
    assert "snakemake" in readme and "workflow" in readme
    assert (REPO / "workflow" / "Snakefile").is_file()
    assert (REPO / "config" / "README.md").read_text().strip()
    for rules in (REPO / "rules", REPO / "workflow" / "rules"):
        assert not rules.is_dir() or any(rules.glob("*.smk"))


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_the_workflow_reads_the_config_folder_a_deployment_gets(name):
    """One standard layout: config/ holds real files (what snakedeploy copies) and workflow/Snakefile embeds
    config/config.yaml; no second workflow folder."""
    assert (REPO / "config" / name).is_file() and not (REPO / "config" / name).is_symlink()
    assert ('configfile: f"{workflow.current_basedir}/../config/config.yaml"'
            in (REPO / "workflow" / "Snakefile").read_text())
    assert not (REPO / "workflows").exists() and not (REPO / "Snakefile").exists()


# ---- a deployed copy


def job_counts(out: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run."""
    counts = {}
    for line in out[out.index("Job stats:"):].splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.fixture(scope="module")
def github(tmp_path_factory):
    """A tagged git repository of this working tree (tracked and untracked, not ignored files) served as
    https://github.com/OWNER_REPO through git's url.insteadOf, and the environment that makes Snakemake
    (which clones GitHub-hosted modules with git) and snakedeploy fetch it from there."""
    assert shutil.which("git") and (REPO / ".git").exists(), "the packaging tests run in a git checkout"
    root = tmp_path_factory.mktemp("github")
    clone = root / "github.com" / OWNER_REPO
    clone.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src, dst = REPO / name, clone / name
        if src.is_symlink() or src.exists():  # (a file deleted in the working tree is still listed)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
    gitconfig = root / "gitconfig"
    gitconfig.write_text(f'[url "file://{root}/github.com/"]\n\tinsteadOf = https://github.com/\n'
                         "[user]\n\tname = test\n\temail = test@example.invalid\n"
                         "[advice]\n\tdetachedHead = false\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GIT_DIR", "GIT_WORK_TREE")}
    env.update(GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1", XDG_CACHE_HOME=str(root / "cache"),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"], ["tag", TAG]):
        subprocess.run(["git", *cmd], cwd=clone, check=True, env=env, capture_output=True)
    return env


def deploy_by_hand(dest: Path):
    """What `snakedeploy deploy-workflow https://github.com/OWNER_REPO DEST --tag TAG` writes: the repository's
    config/ (links followed) and profiles/, and a workflow/Snakefile that uses every rule of the module
    github(OWNER_REPO, path="workflow/Snakefile") with the deployment's config/config.yaml."""
    shutil.copytree(REPO / "config", dest / "config")
    shutil.copytree(REPO / "profiles", dest / "profiles")
    (dest / "workflow").mkdir()
    (dest / "workflow" / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n\n\n'
        "module moespac:\n"
        f'    snakefile:\n        github("{OWNER_REPO}", path="workflow/Snakefile", tag="{TAG}")\n'
        "    config:\n        config\n\n\n"
        "use rule * from moespac\n")


def dry_run(cwd: Path, env: dict, *args) -> dict[str, int]:
    r = subprocess.run([str(BIN / "snakemake"), "-n", "--quiet", "rules", *map(str, args)], cwd=cwd, env=env,
                       check=False, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Job stats:" in r.stdout, f"nothing to do (no default target?): {r.stdout[-1000:]}"
    return job_counts(r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("paper", [False, True], ids=["default", "paper"])
def test_a_deployed_copy_dry_runs_the_same_jobs_as_the_root_snakefile(github, tmp_path, paper):
    deployed, plain = tmp_path / "deployed", tmp_path / "plain"
    plain.mkdir()
    deploy_by_hand(deployed)
    counts = dry_run(deployed, github, *(["--configfile", "config/paper.yaml"] if paper else []))
    root = dry_run(plain, github, "-s", REPO / "workflow" / "Snakefile",
                   *(["--configfile", REPO / "config/paper.yaml"] if paper else []))
    # the deployment's default target is the module's `all`, the same as a clone's
    assert counts.pop("all") == 1 and root.pop("all") == 1
    assert counts == root and counts["simulate_cell"] > 100


@pytest.mark.slow
def test_snakedeploy_deploys_workflow_snakefile_and_the_config_folder(github, tmp_path):
    dest = tmp_path / "deployed"
    r = subprocess.run([str(BIN / "snakedeploy"), "deploy-workflow", f"https://github.com/{OWNER_REPO}", str(dest),
                        "--tag", TAG], check=False, env=github, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    snakefile = (dest / "workflow" / "Snakefile").read_text()
    assert f'github("{OWNER_REPO}", path="workflow/Snakefile", tag="{TAG}")' in snakefile
    assert 'configfile: "config/config.yaml"' in snakefile and "use rule * from moespac" in snakefile
    for name in ("config.yaml", "paper.yaml", "README.md"):
        assert not (dest / "config" / name).is_symlink()
        assert (dest / "config" / name).read_bytes() == (REPO / "config" / name).read_bytes()
    assert (dest / "profiles" / "default" / "profile.yaml").is_file()
    counts = dry_run(dest, github)
    assert counts["all"] == 1 and counts["simulate_cell"] > 100
