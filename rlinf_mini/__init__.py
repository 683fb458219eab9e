"""rlinf_mini: RLinf's programming model in plain PyTorch."""

import os

# MKL's strict reproducibility mode makes a CPU matmul's row r depend on row r of its input only, not on how many
# rows are in the batch. Without it, on AVX-512 CPUs a policy forward over 16 envs and over two stages of 8 round
# differently in the last bit, so a pipelined rollout would not be bitwise the unpipelined one. It must be set
# before the first BLAS call of the process (workers inherit it); a user's own MKL_CBWR wins.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
