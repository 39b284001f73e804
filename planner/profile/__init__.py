"""Profiles: measured, analytic and imported model costs."""
