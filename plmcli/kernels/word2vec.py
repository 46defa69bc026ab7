"""word2vec's compiled trainer (kernels/word2vec.cpp): skip-gram and CBOW with negative sampling as word2vec.c and
gensim train them, one SGD step per example on the float32 tables, Hogwild! over `workers` threads.

Compiled on first use by `torch.utils.cpp_extension.load_inline` (g++ and ninja; ~1 minute once) into torch's
extension directory (TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions), under a name that hashes the
source, the flags and the CPU's instruction set: later processes load the cached library without compiling.
`word2vec_kernel()` is None where plm's CPU kernels are switched off (`PLM_CPU_KERNELS=0`, `switched(False)`) — the
caller then trains with plain torch ops — and where the build fails (no compiler): then one notice line on stderr
says so, once per process.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import threading
from pathlib import Path

from plmcli.kernels.switch import ENV, switched_on

SOURCE = Path(__file__).with_name("word2vec.cpp")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-funroll-loops", "-std=c++17"]
"""-ffast-math lets the dot products and row updates vectorise (reordered sums): the same bits run after run on
one machine, not the torch path's bits."""

_lock = threading.Lock()  # one build at a time: a second caller waits for the first one's module


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.machine()


def compile_kernel(name: str, source: str):
    """Compiles (or loads the cached build of) `source` as the extension `name`."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(name=name, cpp_sources=[source], functions=["train"], extra_cflags=FLAGS,
                       extra_ldflags=["-pthread"], verbose=False)


def word2vec_kernel():
    """The compiled trainer's module (its `train(...)`: see word2vec.cpp), or None: kernels switched off, or no
    build possible (a notice on stderr, once)."""
    if not switched_on():
        return None
    source = SOURCE.read_text()
    with _lock:
        return _built(hashlib.sha1("\n".join([source, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:12], source)


@functools.lru_cache(maxsize=None)
def _built(key: str, source: str):
    """The loaded module of the source hashed `key` (or None after a failed build): one build per process."""
    try:
        return compile_kernel(f"plm_word2vec_{key}", source)
    except Exception as e:  # no compiler, no ninja, a failed compile: the torch path trains instead
        reason = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
        print(f"plm: word2vec's compiled trainer could not be built ({reason}); training with torch ops "
              f"instead (several times slower, model.workers ignored) — install g++ and ninja for the fast "
              f"path, or set {ENV}=0 to choose the torch path silently", file=sys.stderr)
        return None
