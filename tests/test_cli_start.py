"""The CLI starts without torch: the pipeline runs ~200 short `moespac` jobs, and importing torch costs ~1 s each."""

import subprocess
import sys


def test_cli_parser_does_not_import_torch():
    code = "import sys; from moespac.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_workflow_schema_knows_every_micro_architecture():
    from pathlib import Path

    import yaml

    from moespac.models.micro import ARCHS

    schema = yaml.safe_load((Path(__file__).parent.parent / "workflow/schemas/config.schema.yaml").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("enum") and "qwen3_moe" in node["enum"]:
                found.append(tuple(node["enum"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema)
    assert found and set(found) == {ARCHS}
