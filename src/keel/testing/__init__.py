"""Public test helpers: fakes at Keel's boundaries, never of its machinery."""
