"""Side-by-side benchmarks of plm against its peers; `python -m benchmarks --help` lists them.

Each benchmark is a module with NAME, HELP, add_arguments(parser) and run(args), registered in
__main__.BENCHMARKS, and owns one section of BENCHMARKS.md.
"""
