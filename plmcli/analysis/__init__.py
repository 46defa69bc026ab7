"""Looking inside trained models: attention patterns, probing classifiers, training curves."""
