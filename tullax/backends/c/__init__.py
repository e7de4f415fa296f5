"""The host C backend: C99 + OpenMP printed from the loop IR, compiled by the system's C compiler."""
