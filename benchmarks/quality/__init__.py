"""Quality: what a model reaches (accuracy, F1, perplexity, loss) under a fixed budget, plm against its baselines."""
