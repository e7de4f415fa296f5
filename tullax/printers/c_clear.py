"""The parallel clear a C module exports beside its kernels, where a kernel adds into its output: a '+=' step of
a gradient that starts from zeros clears its fresh output itself (``tullax.calls.host``), on the team of
threads its kernel then runs on. One memset leaves the other cores idle, and Python threads clearing beside that
team would fight its spinning threads. Each thread clears whole blocks of 2 MiB, the huge pages the output was
advised (``tullax.runtime.hugepages``).

The C printer prints ``CLEAR_SOURCE`` (``tullax.printers.c.print_module``); the ``c`` backend calls
``CLEAR_FUNCTION`` (``CHostKernel.clear_bytes``). This module imports only the huge page's size: a warm process
loads a module's library without importing the printer.
"""
from tullax.runtime.hugepages import HUGE_PAGE

CLEAR_FUNCTION = "tx_clear"  # void tx_clear(char* p, tx_i64 nbytes, int tx_threads)
CLEAR_BLOCK = HUGE_PAGE  # each thread clears whole huge pages

CLEAR_SOURCE = f"""\
// {CLEAR_FUNCTION}: zero nbytes from p, in blocks of {CLEAR_BLOCK} bytes over tx_threads threads
void {CLEAR_FUNCTION}(char* restrict p, const tx_i64 nbytes, const int tx_threads)
{{
    const tx_i64 blocks = (nbytes + {CLEAR_BLOCK - 1}) / {CLEAR_BLOCK};
    #pragma omp parallel for schedule(static) num_threads(tx_threads) if(tx_threads > 1)
    for (tx_i64 block = 0; block < blocks; ++block) {{
        const tx_i64 lo = block * {CLEAR_BLOCK};
        memset(p + lo, 0, (size_t)(nbytes - lo < {CLEAR_BLOCK} ? nbytes - lo : {CLEAR_BLOCK}));
    }}
}}
"""

__all__ = ["CLEAR_BLOCK", "CLEAR_FUNCTION", "CLEAR_SOURCE"]
