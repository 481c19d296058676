import moespac  # noqa: F401  (pins the kernels before a test imports torch or numpy)
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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one torch thread is fastest, and a waiting OpenMP team on a busy machine makes each
    operator many times slower (restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
