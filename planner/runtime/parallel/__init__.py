"""Parallelism helpers of the runtime that span stages: tied parameters (:mod:`.tied`)."""
