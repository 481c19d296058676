import os

import pytest

# Never reach for the hub in tests: an unknown id must fail fast with our offline message.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory):
    """A micro pair on disk (qwen3_moe target, dense draft), shared by CLI tests."""
    from moespac.models.micro import make_micro

    return make_micro(tmp_path_factory.mktemp("micro"), "qwen3_moe", seed=0)
