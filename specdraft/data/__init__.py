"""The on-disk training data (the contract between `distill-data` and `train`) and its loading."""
