"""`pipeline bench` (DESIGN §12): the pipeline's figures beside references, in one run."""
