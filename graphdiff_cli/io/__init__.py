"""Files: stamped Zarr artifacts, the STATE directory of the step handoff, and users' tables."""
