"""Drafter training data: prompt sources, target-regenerated responses in a tensorstore response store,
and the grain input pipeline over it (`sources` -> `responses` -> `store` -> `pipeline`)."""
