"""A small forward pass on a CPU runs on one torch thread: waking the other threads costs it more than they give.

Each layer of a pass is a parallel region; with OMP_WAIT_POLICY=PASSIVE (worker/engine/cpus.py) the threads
sleep between regions, and every region of a one-row pass waits for a sleeping thread to wake, beside busy
neighbours for a time slice. bench/threads.py --tokens 12 on the 2-core development machine (other work beside
it): a one-row MiniLM pass ran 98 passes/s on one PASSIVE thread against 66/s on two, and 83/s against 35/s
beside a busy loop; at 32 rows two threads won again beside the busy loop (7.7 against 6.2). So passes of at most
SMALL_PASS_TOKENS padded tokens (one short text: the idle path of an interactive request) run on one thread,
and every other pass on all of them, as decided at start-up.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

SMALL_PASS_TOKENS = 32  # padded tokens (rows x longest row) up to which a CPU pass runs on one thread


def for_pass(padded_tokens: int, device) -> contextlib.AbstractContextManager:
    """The thread count for one forward pass of `padded_tokens` on `device` (a torch device, or a model's device
    string): one thread for a small pass on a CPU, else as it is. Nothing where torch is not loaded (the null
    model) or the pass runs elsewhere (a GPU: its threads only feed it)."""
    torch = sys.modules.get("torch")
    if torch is None or padded_tokens > SMALL_PASS_TOKENS or not str(device).startswith("cpu"):
        return contextlib.nullcontext()
    return _one_thread(torch)


@contextlib.contextmanager
def _one_thread(torch) -> Iterator[None]:
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)  # ~0.1 us: libgomp keeps its idle threads for the next larger pass
    try:
        yield
    finally:
        torch.set_num_threads(threads)
