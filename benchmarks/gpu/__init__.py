"""GPU: checks and benchmarks for one lent GPU (syncs, fp16, resume, MFU, unpadded steps, FSDP); they skip without CUDA."""
