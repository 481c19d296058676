"""The CLI starts without torch: the pipeline runs ~200 short `moespac` jobs, and importing torch costs ~1 s each."""

import subprocess
import sys


def test_cli_parser_does_not_import_torch():
    code = "import sys; from moespac.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_make_micro_choices_match_the_builder():
    from moespac.commands.make_micro import ARCHS
    from moespac.models.micro import ARCHS as BUILT

    assert ARCHS == BUILT
