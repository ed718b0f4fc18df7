"""One proposer per method; each builds on `base.LayerSkipProposerBase`."""
