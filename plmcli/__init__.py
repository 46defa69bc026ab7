"""plm: one model zoo, one training loop, one YAML recipe per model."""

__version__ = "0.1.0"
