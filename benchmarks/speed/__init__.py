"""Speed: per-step, throughput and memory comparisons of plm against its peers on the CPU."""
