"""Side-by-side benchmarks of plm against its peers; `python -m benchmarks --help` lists them by group.

The groups are subpackages: speed/ (per-step, throughput and memory on the CPU), quality/ (what a model
reaches) and gpu/ (checks and benchmarks for a lent GPU, gpu/gpu_device.sh runs them there). Each benchmark
is a module with NAME, HELP, add_arguments(parser), run(args) and, for the shared options it takes
(--repeats, --keep), DEFAULTS; it is registered with its group in __main__.BENCHMARKS and owns one section of
BENCHMARKS.md. common.py (helpers for all) and summary.py (BENCHMARKS.md's summary) stay at the top.
"""
