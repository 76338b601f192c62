"""A parity test whose process the kernel kills at its first write past ``FSIZE_LIMIT`` bytes
(SIGXFSZ): a capture stopped inside a file's write, for real, with no hook in our code. ``SHIFT``
moves a bias, so that a regeneration writes new tensor files."""
from __future__ import annotations

_TEST = '''
import os, resource, signal, torch

def test_{name}(parity):
    limit = os.environ.get("FSIZE_LIMIT")
    if limit:   # the kernel kills this process (SIGXFSZ) at its first write past the limit
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    with torch.no_grad():
        m[2].bias.add_(float(os.environ.get("SHIFT", "0")))
    parity.check(m, torch.randn(256, 64, generator=torch.Generator().manual_seed(3)), name={name!r}, dtypes=["float32"])
'''


def killed_writer_test(name: str) -> str:
    """The source of ``test_<name>``, checking a golden named ``name``."""
    return _TEST.format(name=name)
