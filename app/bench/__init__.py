"""`pipeline bench`: the pipeline's figures beside references, in one run."""
